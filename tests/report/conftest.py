from __future__ import annotations

import pytest

from harness.report import read_session

from .records import failing_session, passing_session, write


@pytest.fixture
def passing(tmp_path):
    return write(tmp_path / "sessions" / "20260101-010000-1" / "results.jsonl", passing_session())


@pytest.fixture
def failing(tmp_path):
    return write(tmp_path / "sessions" / "20260102-010000-2" / "results.jsonl", failing_session())


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory):
    """The failing session's report with its plots: built once (plotting takes a second)."""
    from harness.report import build

    folder = tmp_path_factory.mktemp("failing")
    results = write(folder / "results.jsonl", failing_session())
    return build(read_session([results]), folder / "out" / "report.md")
