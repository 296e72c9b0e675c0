"""harness.spec.records: the step line and steps.jsonl records."""

import json

import pytest

from harness.spec.records import RunRecorder, StepRecord, format_step_line, read_steps


def test_step_line_has_infinitrain_shape():
    record = StepRecord(step=1, loss=5.250158123, lr=1e-4, step_time_ms=12.34,
                        tokens_per_s=4150.4, peak_memory_mb=123.4)
    line = format_step_line(record, 10, dp=1, tp=1, pp=2)
    assert line == (
        "step    1/10 | train loss 5.250158 | lr 1.00e-04 | (12.3 ms | 4150 tok/s | "
        "peak used: 123 MB | DP=1, TP=1, PP=2)"
    )


def test_step_records_keep_full_precision_and_a_rerun_starts_afresh(tmp_path):
    loss = 5.250158123456789
    for _ in range(2):
        recorder = RunRecorder(tmp_path)
        recorder.write_step(StepRecord(1, loss, 1e-4, 1.0, 2.0, 3.0))
    records = read_steps(tmp_path)
    assert len(records) == 1
    assert records[0]["loss"] == loss and records[0]["format"] == "harness.step/1"


def test_a_step_record_of_another_format_is_refused(tmp_path):
    (tmp_path / "steps.jsonl").write_text(json.dumps({"format": "other/9", "loss": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"steps.jsonl:1: record format 'other/9'"):
        read_steps(tmp_path)
