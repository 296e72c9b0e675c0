"""The session header (session.json) in the report: its facts in the report's header, cases it
collected that recorded nothing listed as missing, a session that has a header and no results
yet, and --about filling facts the header recorded as null."""

from __future__ import annotations

import json

from harness.report import build, latest_results, read_session, resolve
from harness.report.cli import main
from harness.results import write_header

from .records import case, passing_session, write


def _header(**values):
    header = {"format": "harness.session/1", "session": "20260101-010000-1",
              "started_at": "2026-01-01T01:00:00+0000", "finished_at": "2026-01-01T01:09:00+0000",
              "config_path": "/repo/configs/test_config.json", "git_commit": "abc123",
              "git_dirty": True, "driver": "550.54.15", "torch": "2.13.0+cu128",
              "collected": [r["name"] for r in passing_session()] + ["basic/llama3/tp2"],
              "args": ["-m", "pipeline_layout", "--gpus", "8"]}
    header.update(values)
    return header


def test_header_facts_and_collected_cases_without_a_result(tmp_path):
    results = write(tmp_path / "s" / "results.jsonl", passing_session())
    write_header(results.parent, _header(finished_at=None))
    text = build(read_session([results]), tmp_path / "report.md", with_plots=False).markdown
    assert ("- **when**: 2026-01-01T01:00:00+0000 → 2026-01-01T01:00:35+0000 (the last result; "
            "the session's end was not recorded)") in text
    assert "- **git commit**: abc123 (with uncommitted changes)" in text
    assert "- **driver**: 550.54.15" in text
    assert "- **config**: /repo/configs/test_config.json" in text
    assert "- **collected**: 7 case(s)" in text
    assert "- **pytest arguments**: -m pipeline_layout --gpus 8" in text
    assert text.count("- **torch**:") == 1  # the header's torch is not listed twice
    assert "- **1 case(s) have no result**" in text and "  - `basic/llama3/tp2`" in text


def test_torch_from_the_header_when_no_run_recorded_it(tmp_path):
    record = case("basic", "gpt2", "pp2", "skipped")  # a skip has no environment
    results = write(tmp_path / "results.jsonl", [record])
    write_header(tmp_path, _header(collected=[record["name"]]))
    text = build(read_session([results]), tmp_path / "report.md", with_plots=False).markdown
    assert "- **torch**: 2.13.0+cu128" in text
    assert "- **when**: 2026-01-01T01:00:00+0000 → 2026-01-01T01:09:00+0000" in text


def test_a_session_with_a_header_and_no_result_yet(tmp_path):
    folder = tmp_path / "sessions" / "20260103-010000-1"
    write(tmp_path / "sessions" / "20260102-010000-1" / "results.jsonl", passing_session())
    write_header(folder, _header(finished_at=None, collected=["basic/gpt2/pp2"]))
    assert latest_results(tmp_path) == folder / "results.jsonl" == resolve(folder)
    session = read_session([resolve(tmp_path)])
    assert session.records == [] and session.unrecorded == ["basic/gpt2/pp2"]
    assert "does not exist: no case recorded a result" in session.notes[0]
    text = build(session, folder / "report.md", with_plots=False).markdown
    assert "not recorded (the session did not finish)" in text


def test_about_fills_what_the_header_recorded_as_null(tmp_path, capsys):
    results = write(tmp_path / "results.jsonl", passing_session())
    write_header(tmp_path, _header(driver=None, git_commit=None, git_dirty=None))
    assert main([str(results), "--no-plots", "--about", "driver=535.1",
                 "--about", "config_path=/elsewhere.json"]) == 0
    capsys.readouterr()
    text = (tmp_path / "report.md").read_text()
    assert "- **driver**: 535.1" in text  # null in the header: --about gives it
    assert "- **config**: /repo/configs/test_config.json" in text  # recorded: the header wins
    assert "- **git commit**: not recorded" in text


def test_a_header_of_another_format_is_ignored_with_a_note(tmp_path):
    results = write(tmp_path / "results.jsonl", passing_session()[:1])
    header = {"format": "other/2", "collected": ["x/y/z"]}
    (tmp_path / "session.json").write_text(json.dumps(header))
    session = read_session([results])
    assert session.header == {} and session.unrecorded == []
    assert "session header format 'other/2'" in session.notes[0]
