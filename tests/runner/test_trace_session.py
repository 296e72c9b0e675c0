"""A planted bug located through a real session: the bundled trainer with a TP all-reduce
scaled on one rank (tests/trace_plants/shim.py, `tp_allreduce=1`). The single-device reference
has no all-reduce, so the self-check fails; `--harness-trace failed` (the default) reruns the
first diverging step on both sides and names the first module whose numbers part, on the rank
that has the bug. The same session under `--harness-trace none` records no trace and says none.
Without the trace stage the record's `trace` is null and the failure text has no trace line:
both assertions below fail then."""

from __future__ import annotations

import json

import pytest

from tests.trace_plants.shim import write_shim

pytestmark = pytest.mark.torchrun


def _session(pytester, *more: str) -> dict:
    from tests.plugin.conftest import plugin_args

    shim = pytester.mkdir("shim") if not (pytester.path / "shim").exists() \
        else pytester.path / "shim"
    write_shim(shim)
    (pytester.path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"],
        "trainer": {"env": {"PYTHONPATH": str(shim), "HARNESS_TRACE_PLANT": "tp_allreduce=1"}},
        "defaults": {"batch_size": 2, "sequence_length": 32, "total_batch_size": 64,
                     "num_iteration": 2, "learning_rate": 0.001},
        "test_groups": [{"tag": "trace", "tests": [
            {"id": "tp2", "args": {"tensor_parallel": 2}}]}]}))
    out = pytester.path / f"out{len(more)}"
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
        "--harness-output", str(out), "--harness-device", "cpu", "--gpus", "2",
        "--harness-reference-cache", str(pytester.path / "refs"), "-p", "no:cacheprovider",
        *more, timeout=600)
    result.assert_outcomes(failed=1)
    return json.loads(next(out.glob("sessions/*/results.jsonl")).read_text().splitlines()[0])


def test_a_tp_all_reduce_scaled_on_one_rank_is_named_at_its_module_and_rank(pytester,
                                                                            tiny_assets):
    record = _session(pytester)
    assert record["self_check"] == "failed"
    trace = record["trace"]
    assert trace is not None and trace["status"] == "diverged", trace
    assert trace["partner"] == "reference" and trace["step"] == 1
    first = trace["first_diverging"]
    # the first row-parallel output of the first layer, on the TP rank that scales it
    assert (first["module"], first["phase"], first["rank"]) == ("h.0.attn.c_proj", "forward", 1)
    assert trace["last_matched"]["phase"] == "forward"
    text = record["errors"][0]
    assert "trace of step 1 against the reference: first diverging: h.0.attn.c_proj forward " \
           "(rank 1)" in text, text
    # the tensors were compared and removed but for the two pairs the failed case keeps
    assert trace["cost"]["kept_bytes"] < trace["cost"]["peak_bytes"]

    quiet = _session(pytester, "--harness-trace", "none")
    assert quiet["trace"] is None and "trace of step" not in quiet["errors"][0]
