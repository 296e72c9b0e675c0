"""The plugin tests' fixtures (the fake trainer backend), shared, not copied."""

import pytest

from tests.plugin.conftest import harness_dir  # noqa: F401  (a fixture)


@pytest.fixture
def records(pytester, monkeypatch):
    """FAKE_RECORD_DIR for the fake trainer: its pids, leases and reference runs land here."""
    folder = pytester.path / "records"
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv("FAKE_RECORD_DIR", str(folder))
    return folder
