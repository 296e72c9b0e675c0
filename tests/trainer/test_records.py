import json

import numpy as np
import pytest

from harness.trainer.gradient_dump import read_manifest, write_gradients, write_manifest
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


def test_gradient_dump_round_trips_and_manifest_lists_each_name_once(tmp_path):
    import torch

    gradients = [("h.3.attn.c_attn.weight", torch.ones(6, 2)), ("wte.weight", torch.arange(4.0))]
    entries = write_gradients(tmp_path, gradients, rank=1)
    write_manifest(tmp_path, entries, step=1)
    np.testing.assert_array_equal(np.load(tmp_path / "h.3.attn.c_attn.weight.npy"), np.ones((6, 2)))
    manifest = read_manifest(tmp_path)
    assert [p["name"] for p in manifest["parameters"]] == ["h.3.attn.c_attn.weight", "wte.weight"]
    assert manifest["parameters"][0] == {"name": "h.3.attn.c_attn.weight", "shape": [6, 2], "rank": 1}
    assert not list(tmp_path.glob(".*partial"))


def test_manifest_refuses_a_parameter_written_twice(tmp_path):
    entries = [{"name": "wte.weight", "shape": [2], "rank": 0},
               {"name": "wte.weight", "shape": [2], "rank": 1}]
    with pytest.raises(RuntimeError, match=r"more than one rank: \['wte.weight'\]"):
        write_manifest(tmp_path, entries, step=1)
