"""Planted bugs through the real plugin, runner and diff with the fake trainer (command backend):
each asserts the exact verdict and the stage and layer named (issue 15, item 2). These are the
classes of harness bug that once let a wrong verdict through: the last stage's own parameters
compared against the reference's files instead of the run's, a non-zero exit after complete
outputs diffed and passed, a difference just above atol / rtol accepted (or one exactly at it
refused), and a chunk's end treated as inclusive by the locator."""

from __future__ import annotations

import json

import pytest

from .conftest import fake_config, harness_args
from .fake_trainer import ATOL, LOSS_RTOL, RTOL

PP2 = {"pipeline_parallel": 2}  # 8 fake layers: chunks [0, 4) on stage 0, [4, 8) on stage 1
BF16 = {"dtype": "bfloat16", **PP2}  # bf16's scale-free thresholds (2e-2, 1e-4) stay out of the way
GRAD_ATOL = {"gradients": {"atol": ATOL, "rtol": 0}}
GRAD_RTOL = {"gradients": {"atol": 0, "rtol": RTOL}}
LOSS_ATOL = {"loss": {"atol": ATOL, "rtol": 0}}
LOSS_RTOL_T = {"loss": {"atol": 0, "rtol": LOSS_RTOL}}

CASES = [
    {"id": "bad-last-stage", "models": ["gpt2", "llama3"], "args": PP2},
    {"id": "exit-after-outputs", "args": PP2},
    {"id": "bad-grad-boundary", "args": {"pipeline_parallel": 2,
                                         "pipeline_layer_partition": "5,3"}},
    {"id": "grad-at-atol", "args": BF16, "tolerances": GRAD_ATOL},
    {"id": "grad-above-atol", "args": BF16, "tolerances": GRAD_ATOL},
    {"id": "grad-at-rtol", "args": BF16, "tolerances": GRAD_RTOL},
    {"id": "grad-above-rtol", "args": BF16, "tolerances": GRAD_RTOL},
    {"id": "loss-at-atol", "args": BF16, "tolerances": LOSS_ATOL},
    {"id": "loss-above-atol", "args": BF16, "tolerances": LOSS_ATOL},
    {"id": "loss-at-rtol", "args": BF16, "tolerances": LOSS_RTOL_T},
    {"id": "loss-above-rtol", "args": BF16, "tolerances": LOSS_RTOL_T},
]



_SESSION: dict = {}  # one session (about 17 s) serves every test of this module


@pytest.fixture(scope="module", autouse=True)
def _session_of_this_run():
    # Per pytest run, not per interpreter: mutmut forks each mutant's run from a process that
    # already ran these tests, and a session kept from that run would judge the unmutated code.
    _SESSION.clear()
    yield
    _SESSION.clear()


@pytest.fixture
def outcome(pytester, harness_dir):
    if not _SESSION:
        harness_dir(fake_config(CASES))
        result = pytester.runpytest(*harness_args(pytester, "--gpus", "2"))
        path = next((pytester.path / "out").glob("sessions/*/results.jsonl"))
        _SESSION["result"] = result
        _SESSION["records"] = {(r["model"], r["case_id"]): r
                               for r in map(json.loads, path.read_text().splitlines())}
    return _SESSION["result"], _SESSION["records"]


def worst(record) -> dict:
    return {w["name"]: w for w in record["gradients"]["worst"]}


def test_planted_bugs_get_the_exact_verdict(outcome):
    result, records = outcome
    result.assert_outcomes(passed=4, failed=8)
    status = {key: r["status"] for key, r in records.items()}
    assert status == {
        ("gpt2", "bad-last-stage"): "failed", ("llama3", "bad-last-stage"): "failed",
        ("gpt2", "exit-after-outputs"): "failed", ("gpt2", "bad-grad-boundary"): "failed",
        ("gpt2", "grad-at-atol"): "passed", ("gpt2", "grad-above-atol"): "failed",
        ("gpt2", "grad-at-rtol"): "passed", ("gpt2", "grad-above-rtol"): "failed",
        ("gpt2", "loss-at-atol"): "passed", ("gpt2", "loss-above-atol"): "failed",
        ("gpt2", "loss-at-rtol"): "passed", ("gpt2", "loss-above-rtol"): "failed",
    }
    for record in records.values():  # a failure's whole text is kept, its first line is the reason
        if record["status"] == "failed":
            assert len(record["errors"]) == 1 and \
                record["reason"] == record["errors"][0].splitlines()[0], record["name"]
            assert record["reason"].startswith(record["name"] + ": the run "), record["reason"]
        else:
            assert record["errors"] == [] and record["reason"] is None, record["name"]
        assert 0 < record["timings"]["total_s"] < 600
        assert record["started_at"] <= record["finished_at"]


def test_last_stage_only_parameters_are_compared_with_the_runs_files(outcome):
    result, records = outcome
    gpt2, llama3 = records[("gpt2", "bad-last-stage")], records[("llama3", "bad-last-stage")]
    # GPT-2's head is the tied wte (dumped as wte.weight); LLaMA 3's lm_head is its own.
    assert gpt2["gradients"]["mismatched"] == 1
    assert {n: (w["stage"], w["layer"], w["mismatched"]) for n, w in worst(gpt2).items()
            if w["mismatched"]} == {"ln_f.weight": ("1 (final norm)", "-", 12)}
    assert llama3["gradients"]["mismatched"] == 2
    assert {n: (w["stage"], w["layer"], w["mismatched"]) for n, w in worst(llama3).items()
            if w["mismatched"]} == {"ln_f.weight": ("1 (final norm)", "-", 12),
                                    "lm_head.weight": ("1 (lm head)", "-", 12)}
    assert sorted(llama3["gradients"]["relative"]["failed"]) == ["lm_head.weight", "ln_f.weight"]
    result.stdout.fnmatch_lines([
        "*fake/llama3/bad-last-stage: the run differs from the single-device reference*",
        "*gradients: mismatched 2 of 19 parameters (24 of 228 elements; atol=1e-05 rtol=0)*"])
    per_layer = {row["layer"]: row for row in llama3["gradients"]["per_layer"]}
    assert per_layer["final_norm"]["stage"] == "1" and per_layer["final_norm"]["mismatched"] == 1
    assert per_layer["head"]["stage"] == "1" and per_layer["head"]["mismatched"] == 1


def test_a_nonzero_exit_after_complete_outputs_is_a_crash(outcome):
    result, records = outcome
    record = records[("gpt2", "exit-after-outputs")]
    assert record["status"] == "failed" and record["returncode"] == 1
    assert record["reason"] == "fake/gpt2/exit-after-outputs: the run failed: exit code 1"
    assert record["losses"] == [4.875, 4.75, 4.625]  # every step was written ...
    assert "loss" not in record or record["loss"] is None  # ... and not diffed
    result.stdout.fnmatch_lines(["*fake/gpt2/exit-after-outputs: the run failed: exit code 1*",
                                 "*fake: exiting 1 after writing every output*"])


def test_a_chunks_end_is_exclusive(outcome):
    # Partition 5,3: stage 0 holds layers [0, 5), so layer 5 is the first of stage 1.
    records = outcome[1]
    record = records[("gpt2", "bad-grad-boundary")]
    assert record["layout"]["chunks"] == [[0, 0, 5], [1, 5, 8]]
    named = {n: (w["stage"], w["layer"]) for n, w in worst(record).items() if w["mismatched"]}
    assert named == {"h.5.attn.c_proj.weight": ("1", "5")}
    # Uniform pp 2: layer 4 opens stage 1.
    above = records[("gpt2", "grad-above-atol")]
    assert {n: (w["stage"], w["layer"]) for n, w in worst(above).items()
            if w["mismatched"]} == {"h.4.mlp.c_fc.weight": ("1", "4")}


@pytest.mark.parametrize("which, delta", [("atol", ATOL), ("rtol", RTOL * 1.5)])
def test_gradient_differences_at_and_just_above_the_tolerance(outcome, which, delta):
    result, records = outcome
    at, above = records[("gpt2", f"grad-at-{which}")], records[("gpt2", f"grad-above-{which}")]
    for record in (at, above):
        assert record["loss"]["mismatched"] == 0 and record["gradients"]["relative"]["ok"]
    assert at["gradients"]["mismatched"] == 0 and at["gradients"]["max_abs_diff"] == delta
    assert above["gradients"]["mismatched"] == 1
    assert above["gradients"]["mismatched_elements"] == 1
    w = worst(above)["h.4.mlp.c_fc.weight"]
    assert w["worst_index"] == [0, 0] and w["worst_ref"] == 1.5
    assert w["max_abs_diff"] == delta + 2**-23  # one float32 ulp (in [1, 2)) above


@pytest.mark.parametrize("which, delta", [("atol", ATOL), ("rtol", LOSS_RTOL * 4.75)])
def test_loss_differences_at_and_just_above_the_tolerance(outcome, which, delta):
    result, records = outcome
    at, above = records[("gpt2", f"loss-at-{which}")], records[("gpt2", f"loss-above-{which}")]
    for record in (at, above):
        assert record["gradients"]["mismatched"] == 0 and record["loss"]["relative"]["ok"]
    assert at["loss"]["mismatched"] == 0 and at["loss"]["max_abs_diff"] == delta
    assert above["loss"]["mismatched"] == 1 and above["loss"]["mismatched_steps"] == [2]
    assert above["loss"]["first_diverging_step"] == 2
    assert above["loss"]["max_abs_diff"] == delta + 2**-50  # one float64 ulp (in [4, 8)) above
