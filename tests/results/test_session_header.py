"""The session header's optional `trainer` ({name, version, build_dir, device}): absent from
new_header's callers that do not give it (null in the file), written and read back when given,
refused with an unknown key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.session import HEADER_FIELDS, new_header, read_header, write_header

TRAINER = {"name": "infinitrain", "version": "infinitrain-3f2a9c0d1e2f3a4b",
           "build_dir": Path("/opt/infinitrain/build"), "device": "cpu"}


def _header(tmp_path, **more):
    return new_header("20260101-000000-1", "2026-01-01T00:00:00+0000", None, tmp_path, [],
                      **more)


def test_trainer_is_a_header_field_null_by_default(tmp_path):
    assert "trainer" in HEADER_FIELDS and "torch" in HEADER_FIELDS
    header = _header(tmp_path)
    assert header["trainer"] is None
    write_header(tmp_path, header)
    assert read_header(tmp_path)["trainer"] is None


def test_trainer_is_written_and_read_back(tmp_path):
    header = _header(tmp_path, trainer=TRAINER)
    assert header["trainer"] == {**TRAINER, "build_dir": "/opt/infinitrain/build"}
    write_header(tmp_path, header)
    back = read_header(tmp_path)
    assert back["trainer"] == header["trainer"]
    assert json.loads((tmp_path / "session.json").read_text())["trainer"]["device"] == "cpu"
    partial = _header(tmp_path, trainer={"name": "harness", "device": "cuda"})["trainer"]
    assert partial == {"name": "harness", "version": None, "build_dir": None, "device": "cuda"}


def test_an_unknown_trainer_key_is_refused(tmp_path):
    with pytest.raises(TypeError, match="flavour"):
        _header(tmp_path, trainer={"name": "infinitrain", "flavour": "x"})


def test_how_the_binaries_were_identified_is_written_when_the_backend_says(tmp_path):
    """The trainer identity a wrapper script gets: what it execs (issue 35)."""
    identified = {"gpt2": "script -> /opt/infinitrain/bin/gpt2", "llama3": "elf"}
    header = _header(tmp_path, trainer={**TRAINER, "identified": identified})
    write_header(tmp_path, header)
    assert read_header(tmp_path)["trainer"]["identified"] == identified


def test_settings_are_written_and_read_back_and_older_headers_have_none(tmp_path):
    assert "settings" in HEADER_FIELDS
    assert _header(tmp_path)["settings"] is None  # a caller that gives none: null
    settings = {"slots": 8, "device": "cpu", "variables": ["A=1"], "marker": None}
    write_header(tmp_path, _header(tmp_path, settings=settings))
    assert read_header(tmp_path)["settings"] == settings


def test_a_setting_a_header_cannot_hold_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"settings: 'golden_dir' is PosixPath\('/g'\); "
                                         r"expected a JSON scalar or a list of strings"):
        _header(tmp_path, settings={"golden_dir": Path("/g")})
