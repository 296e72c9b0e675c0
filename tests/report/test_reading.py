"""Reading results without trusting them: bad and truncated lines, missing keys, duplicates,
cases with no record, and where the default session is found."""

from __future__ import annotations

import json

import pytest

from harness.report import NoResults, latest_results, read_session, resolve

from .records import case, passing_session, write


def test_a_partial_file_keeps_its_good_records_and_names_its_bad_lines(tmp_path):
    records = passing_session()
    text = json.dumps(records[0]) + "\n" + "garbage{\n" + json.dumps([1, 2]) + "\n"
    text += json.dumps({"format": "harness.result/9", "status": "passed"}) + "\n"
    text += json.dumps({**records[1], "status": "maybe"}) + "\n"
    text += json.dumps(records[2]) + "\n" + json.dumps(records[3])[:70]  # killed mid-write
    path = tmp_path / "results.jsonl"
    path.write_text(text)

    session = read_session([path])

    assert [r["case_id"] for r in session.records] == ["single", "pp2-partition-3-5"]
    problems = {b.number: b.problem for b in session.bad_lines}
    assert problems[2].startswith("not JSON")
    assert problems[3] == "not a record (a JSON list)"
    assert problems[4] == "format 'harness.result/9', expected 'harness.result/2'"
    assert problems[5].startswith("status 'maybe'")
    assert problems[7] == "truncated (the session stopped while writing it)"


def test_missing_keys_are_null_and_the_name_gives_tag_model_id(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"format": "harness.result/1", "status": "passed",
                                "name": "basic/gpt2/pp2"}) + "\n")
    (record,) = read_session([path]).records
    assert (record["tag"], record["model"], record["case_id"]) == ("basic", "gpt2", "pp2")
    assert record["loss"] is None and record["errors"] == []


def test_a_case_folder_without_a_record_and_header_cases_are_unrecorded(tmp_path):
    path = write(tmp_path / "s" / "results.jsonl", passing_session()[:2])
    (tmp_path / "s" / "cases" / "basic" / "gpt2" / "tp2" / "logs").mkdir(parents=True)
    (tmp_path / "s" / "cases" / "basic" / "gpt2" / "pp2").mkdir(parents=True)  # recorded
    (tmp_path / "s" / "session.json").write_text(json.dumps(
        {"format": "harness.session/1", "collected": ["basic/gpt2/pp2", "basic/llama3/dp2"]}))
    session = read_session([path])
    assert session.unrecorded == ["basic/gpt2/tp2", "basic/llama3/dp2"]


def test_a_case_recorded_twice_keeps_the_last_record_and_says_so(tmp_path):
    first = case("basic", "gpt2", "pp2", tokens=1.0)
    again = case("basic", "gpt2", "pp2", tokens=2.0)
    session = read_session([write(tmp_path / "r.jsonl", [first, again])])
    assert [r["tokens_per_s"] for r in session.records] == [2.0]
    assert "basic/gpt2/pp2 is recorded more than once" in session.notes[0]


def test_latest_session_and_what_an_argument_may_name(tmp_path):
    old = write(tmp_path / "sessions" / "20260101-010000-9" / "results.jsonl", [])
    new = write(tmp_path / "sessions" / "20260102-010000-1" / "results.jsonl", [])
    assert latest_results(tmp_path) == new
    assert resolve(tmp_path) == new
    assert resolve(old.parent) == old
    assert resolve(old) == old
    with pytest.raises(NoResults, match="not a results file"):
        resolve(tmp_path / "nowhere")
    with pytest.raises(NoResults, match="no .*results.jsonl"):
        latest_results(tmp_path / "empty")


def test_the_plugins_own_cpu_session_reads_cleanly():
    """A real results file from `pytest -p harness.plugin` on CPU: the format contract."""
    from pathlib import Path

    session = read_session([Path(__file__).parent / "data" / "cpu_session.jsonl"])
    assert not session.bad_lines and len(session.records) == 5
    assert {r["status"] for r in session.records} == {"passed", "skipped"}
