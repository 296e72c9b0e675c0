"""harness.contracts.records: the step line, the steps.jsonl records, and the one records I/O
module's readers and writer (tolerant and strict JSONL, run.json, the locked append)."""

import json

import pytest

from harness.contracts.records import (
    RESULTS_NAME,
    RUN_NAME,
    STEPS_NAME,
    RunRecorder,
    StepRecord,
    append_jsonl,
    format_step_line,
    read_jsonl,
    read_run,
    read_steps,
    scan_jsonl,
    write_steps,
)


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


def test_a_half_written_last_line_is_skipped_by_the_tolerant_reader(tmp_path):
    path = tmp_path / STEPS_NAME
    path.write_text('{"step": 1, "loss": 1.0}\n\n  \n{"step": 2, "loss": 0.5}\n{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    assert read_jsonl(tmp_path / "absent.jsonl") == []  # a run that wrote nothing
    with pytest.raises(FileNotFoundError):  # a path someone typed
        read_jsonl(tmp_path / "absent.jsonl", missing_ok=False)


def test_scan_tells_a_cut_last_line_from_a_bad_line_inside(tmp_path):
    path = tmp_path / RESULTS_NAME
    path.write_bytes(b'{"a": 1}\nnot json\n\xff{"b": 2}\n{"c": ')
    lines = scan_jsonl(path)
    assert [(line.number, line.value) for line in lines] == [(1, {"a": 1}), (2, None), (3, None),
                                                             (4, None)]
    assert lines[1].problem.startswith("not JSON (Expecting value at column 1)")
    assert lines[2].problem.startswith("not JSON") and lines[2].text.startswith("\ufffd")
    assert lines[3].problem.startswith("truncated")
    # The same bad line with its newline written is not a cut one.
    path.write_text('{"c": \n')
    assert scan_jsonl(path)[0].problem.startswith("not JSON")


def test_the_strict_step_reader_names_a_line_that_is_not_json(tmp_path):
    write_steps(tmp_path / STEPS_NAME, [{"step": 1, "loss": 2.0, "loss_resolution": 1e-6}])
    assert read_steps(tmp_path)[0] == {"format": "harness.step/1", "step": 1, "loss": 2.0,
                                       "loss_resolution": 1e-6}
    with open(tmp_path / STEPS_NAME, "a") as stream:
        stream.write('{"format": "harness.step/1", "st')
    with pytest.raises(ValueError, match=r"steps.jsonl:2: truncated"):
        read_steps(tmp_path)


def test_run_json_read_back_or_none(tmp_path):
    assert read_run(tmp_path) is None
    (tmp_path / RUN_NAME).write_text('{"format": "harness.run/1", "fla')
    assert read_run(tmp_path) is None  # cut short: as if absent, never an exception
    (tmp_path / RUN_NAME).write_text('[1, 2]')
    assert read_run(tmp_path) is None  # not a record
    (tmp_path / RUN_NAME).write_text('{"format": "harness.run/1"}')
    assert read_run(tmp_path) == {"format": "harness.run/1"}


def test_append_writes_whole_lines_and_refuses_nan(tmp_path):
    path = tmp_path / "session" / RESULTS_NAME
    append_jsonl(path, {"name": "a", "loss": 1.5})
    append_jsonl(path, {"name": "b"})
    assert path.read_text() == '{"name": "a", "loss": 1.5}\n{"name": "b"}\n'
    with pytest.raises(ValueError):
        append_jsonl(path, {"loss": float("nan")})
    assert read_jsonl(path) == [{"name": "a", "loss": 1.5}, {"name": "b"}]
