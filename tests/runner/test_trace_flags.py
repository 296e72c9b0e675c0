"""The trace stage's pure helpers: the flags of a trace rerun (harness.contracts.trace.trace_flags,
as harness.runner.trace uses it), the step traced, a pipeline rank's stage's global layers and
the failure text's trace line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.compare.trace import not_traced
from harness.contracts.flags import FLAG_TABLE, run_private
from harness.contracts.trace import PRECISION_CHECK_FLAG, precision_check_value
from harness.runner.trace import (BASELINE, REFERENCE, TRACE_THRESHOLDS, first_failing_step,
                                  stage_layers, thresholds_for, trace_flags, trace_lines)

PRIVATE = sorted(name for name in FLAG_TABLE if run_private(name))
RESUME = sorted(name for name, flag in FLAG_TABLE.items() if flag.role == "resume")

CASE = {"model": "gpt2", "input_bin": "data/tiny.bin", "batch_size": 4, "num_iteration": 12,
        "learning_rate": 1e-4, "tensor_parallel": 2, "nthread_per_process": 2,
        "some_new_flag": "kept"}


def test_the_table_has_private_and_resume_flags():
    assert {"output_dir", "dump_gradients", "precision_check"} <= set(PRIVATE)
    assert RESUME == ["load"]


def test_private_outputs_and_resume_flags_are_dropped(tmp_path):
    flags = {**CASE, **{name: f"/case/{name}" for name in PRIVATE},
             "load": "/ckpt/x/checkpoint_step_000004"}
    out = trace_flags(flags, 3, tmp_path / "dump")
    for name in PRIVATE + RESUME:
        if name != PRECISION_CHECK_FLAG:
            assert name not in out, name
    assert out[PRECISION_CHECK_FLAG] == f"level=1,save_tensors=true,path={tmp_path / 'dump'}"
    assert out[PRECISION_CHECK_FLAG] == precision_check_value(tmp_path / "dump")
    assert out["num_iteration"] == 3
    # everything else as the case had it, the unknown flag included
    assert {k: v for k, v in out.items() if k not in (PRECISION_CHECK_FLAG, "num_iteration")} \
        == {k: v for k, v in CASE.items() if k != "num_iteration"}
    assert flags["num_iteration"] == 12 and flags["load"]  # the case's own flags untouched


def test_num_iteration_is_the_step_even_without_one(tmp_path):
    flags = {k: v for k, v in CASE.items() if k != "num_iteration"}
    out = trace_flags(flags, "2", tmp_path)
    assert out["num_iteration"] == 2


@pytest.mark.parametrize("iters", [0, None, "0", "absent"])
def test_a_decay_over_num_iteration_is_pinned_to_the_case_length(tmp_path, iters):
    flags = {**CASE, "lr_decay_style": "cosine"}
    if iters != "absent":
        flags["lr_decay_iters"] = iters
    out = trace_flags(flags, 5, tmp_path)
    assert out["lr_decay_iters"] == 12 and out["num_iteration"] == 5


def test_the_default_length_is_the_tables(tmp_path):
    flags = {k: v for k, v in CASE.items() if k != "num_iteration"}
    out = trace_flags({**flags, "lr_decay_style": "linear"}, 1, tmp_path)
    assert out["lr_decay_iters"] == FLAG_TABLE["num_iteration"].default


def test_an_explicit_decay_length_is_kept(tmp_path):
    out = trace_flags({**CASE, "lr_decay_style": "cosine", "lr_decay_iters": 7}, 5, tmp_path)
    assert out["lr_decay_iters"] == 7


def test_no_decay_style_no_decay_length(tmp_path):
    out = trace_flags(CASE, 5, tmp_path)
    assert "lr_decay_iters" not in out


# ------------------------------------------------------------------------ the step traced

def _judged(first):
    return SimpleNamespace(verdict=SimpleNamespace(loss=SimpleNamespace(first=first)))


def _baseline(step):
    return SimpleNamespace(verdict=SimpleNamespace(first_diverging_step=step))


def test_first_failing_step_against_the_reference():
    assert first_failing_step(_judged((4, 1.0, 1.5)), None, REFERENCE) == 4
    assert first_failing_step(_judged(None), None, REFERENCE) == 1
    no_loss = SimpleNamespace(verdict=SimpleNamespace(loss=None))
    assert first_failing_step(no_loss, None, REFERENCE) == 1
    assert first_failing_step(None, _baseline(6), REFERENCE) == 1


def test_first_failing_step_against_the_baseline():
    assert first_failing_step(_judged((4, 1.0, 1.5)), _baseline(6), BASELINE) == 6
    assert first_failing_step(None, _baseline(None), BASELINE) == 1
    assert first_failing_step(None, SimpleNamespace(verdict=None), BASELINE) == 1
    assert first_failing_step(None, None, BASELINE) == 1


# ------------------------------------------------------------------------- stage layers

def test_stage_layers_pp2_world4():
    layout = {"chunks": [[0, 0, 4], [1, 4, 8]]}
    assert stage_layers(layout, 4, 2) == {0: (0, 1, 2, 3), 1: (0, 1, 2, 3),
                                          2: (4, 5, 6, 7), 3: (4, 5, 6, 7)}


def test_stage_layers_of_virtual_chunks_are_sorted():
    layout = {"chunks": [[0, 4, 6], [1, 2, 4], [0, 0, 2], [1, 6, 8]]}
    assert stage_layers(layout, 2, 2) == {0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}


@pytest.mark.parametrize("layout,pp", [({"chunks": [[0, 0, 4]]}, 1), (None, 2), ({}, 2),
                                       ({"chunks": []}, 2), ("chunks", 2)])
def test_no_stage_layers_without_a_pipeline_layout(layout, pp):
    assert stage_layers(layout, 4, pp) == {}


# ---------------------------------------------------------------------- the trace lines

def test_trace_lines():
    assert trace_lines(None) == []
    diverged = {"status": "diverged", "step": 3, "partner": REFERENCE,
                "line": "first diverging: h.0.mlp forward (rank 0): max |d| 0.1 > 1e-06"}
    assert trace_lines(diverged) == [
        "trace of step 3 against the reference: first diverging: h.0.mlp forward (rank 0): "
        "max |d| 0.1 > 1e-06"]
    matched = {**diverged, "status": "matched", "line": "every module matched at step 3"}
    assert trace_lines(matched) == ["trace of step 3 against the reference: every module "
                                    "matched at step 3"]
    skipped = not_traced("skipped", "not traced: no precision check here", 1, BASELINE)
    assert trace_lines(skipped) == ["trace of step 1 against the pytorch baseline: skipped: "
                                    "not traced: no precision check here"]
    error = not_traced("error", "trace unreadable: x", 2, REFERENCE)
    assert trace_lines(error) == ["trace of step 2 against the reference: error: trace "
                                  "unreadable: x"]


def test_thresholds_per_dtype():
    assert thresholds_for(None) is TRACE_THRESHOLDS["float32"]
    assert thresholds_for("bfloat16") is TRACE_THRESHOLDS["bfloat16"]
    assert thresholds_for("float64") is TRACE_THRESHOLDS["float32"]
    assert all(t.source for t in TRACE_THRESHOLDS.values())


def test_a_trace_rerun_writes_no_checkpoint_where_a_resumed_case_reads(tmp_path):
    """trace_flags' docstring: "its checkpoint / resume flags dropped (a trace rerun must not
    write where a resumed case reads)". A case's `--save` root is where its resume cases read
    (harness.runner.checkpoints), and InfiniTrain saves at its last step
    (gpt2/main.cc:508-511: (step + 1) == num_iteration), so a rerun cut at step 3 would write
    checkpoint_step_000003 there. `save_interval` goes with it: alone it is fatal
    (main.cc:139)."""
    flags = {**CASE, "save": "/session/checkpoints/gpt2/x", "save_interval": 4,
             "max_checkpoint_keep": 3}
    out = trace_flags(flags, 3, tmp_path)
    assert "save" not in out and "save_interval" not in out
