"""harness.results.summary: the session section's lines, read from a results file."""

from __future__ import annotations

import json

from harness.results.summary import status_counts, summary_lines


def _record(name: str, status: str) -> dict:
    tag, model, _ = name.split("/")
    return {"name": name, "tag": tag, "model": model, "status": status}


def test_a_rerun_counts_once_the_last_record_winning_and_groups_are_in_name_order():
    records = [_record("basic/gpt2/a", "failed"), _record("basic/gpt2/a", "passed"),
               _record("basic/gpt2/b", "skipped"), _record("pipeline/llama3/c", "error"),
               {"name": "damaged"}, "not a record"]
    counts = status_counts(records)
    assert list(counts) == [("basic", "gpt2"), ("pipeline", "llama3")]
    assert counts[("basic", "gpt2")] == {"passed": 1, "failed": 0, "skipped": 1, "error": 0}
    assert counts[("pipeline", "llama3")]["error"] == 1


def test_the_lines_name_the_folder_trainer_counts_added_lines_and_the_report(tmp_path):
    (tmp_path / "results.jsonl").write_text(
        "\n".join(json.dumps(r) for r in (_record("basic/gpt2/a", "passed"),
                                            _record("basic/gpt2/b", "failed"))) + "\n")
    trainer = {"name": "infinitrain", "version": "infinitrain-3f2a", "build_dir": "/b",
               "device": "cpu"}
    lines = summary_lines(tmp_path, trainer, ["history: 3 nights"])
    assert lines[0] == f"session folder: {tmp_path.resolve()}"
    assert lines[1] == "trainer: infinitrain (infinitrain-3f2a, build /b), device cpu"
    assert lines[2:4] == ["  basic / gpt2: 1 passed, 1 failed", "history: 3 nights"]
    assert lines[-1] == f"report: python -m harness.report {tmp_path.resolve()}"


def test_no_results_file_no_section(tmp_path):
    assert summary_lines(tmp_path, None, ["history: x"]) == []
