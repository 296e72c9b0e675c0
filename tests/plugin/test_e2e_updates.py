"""A bug in the update path, located (issue 15, item 4): the optimizer skips GPT-2's tied head on
the last pipeline stage. Step 1's gradients are right, so the gradient dump passes; the loss moves
from step 2 on, naming nothing. The parameter updates the trainer dumps after the last step
(--dump_parameter_updates, compared like gradients) name the parameter and its stage."""

from __future__ import annotations

import textwrap

import pytest

from .test_e2e import records, run, write_config

pytestmark = pytest.mark.slow
pytest.importorskip("harness.trainer.parallel.engine")

SKIP_HEAD = textwrap.dedent("""
    import os
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch
        from harness.trainer.parallel import engine

        live = []
        original_fb = engine.ParallelEngine.forward_backward
        original_step = torch.optim.SGD.step

        def forward_backward(self, inputs, targets):
            live[:] = [self]
            return original_fb(self, inputs, targets)

        def step(self, *args, **kwargs):
            eng = live[0] if live else None
            held = []
            if eng is not None and eng.world.pp_rank == eng.world.sizes["pp"] - 1:
                for _spec, module in eng.chunks:
                    for name, p in module.named_parameters():
                        if name == "lm_head.weight":
                            held.append((p, p.grad))
                            p.grad = None  # SGD skips it: the head's copy is never stepped
            try:
                return original_step(self, *args, **kwargs)
            finally:
                for p, grad in held:
                    p.grad = grad

        engine.ParallelEngine.forward_backward = forward_backward
        torch.optim.SGD.step = step
""")


def test_an_optimizer_skipping_the_tied_head_is_located(pytester):
    shim = pytester.mkdir("shim")
    (shim / "sitecustomize.py").write_text(SKIP_HEAD)
    case = {"id": "pp2-skip-head", "models": ["gpt2"], "args": {"pipeline_parallel": 2}}
    write_config(pytester, [case], env={"PYTHONPATH": str(shim)})
    result = run(pytester)
    result.assert_outcomes(failed=1)
    record = records(pytester)["e2e/gpt2/pp2-skip-head"]
    grads = record["gradients"]
    assert grads["mismatched"] == 0 and grads["relative"]["ok"]  # step 1 is right
    assert record["loss"]["mismatched_steps"][:1] == [2] or record["loss"]["relative"]["ok"] is False
    updates = grads["parameter_updates"]
    # Later steps' gradients follow the wrong head, so other updates move too, but far less:
    # the skipped parameter is the worst, at 1 (no update at all) less the rounding floor.
    assert updates["relative"]["failed"][0] == "lm_head.weight"
    others = [p for p in updates["per_parameter"] if p["name"] != "lm_head.weight"]
    assert max(p["relative_error"] for p in others) < 0.5
    assert updates["relative"]["worst_parameter"] == "lm_head.weight"
    assert updates["relative"]["worst_stage"] == "1 (lm head)"
    # no update at all: relative error 1, less the rounding floor (verdict.UPDATE_RESOLUTION)
    assert 0.99 < updates["relative"]["worst"] <= 1.0
    worst = {w["name"]: w for w in updates["worst"]}
    assert worst["lm_head.weight"]["stage"] == "1 (lm head)" and worst["lm_head.weight"]["layer"] == "-"
    assert updates["parameters"] == 101  # 100 gradients + the head's own copy of wte
    result.stdout.fnmatch_lines([
        "*e2e/gpt2/pp2-skip-head: the run differs from the single-device reference*",
        "*parameter updates (scale-free): worst ||got-ref||/||ref|| 0.99* at lm_head.weight "
        "(stage 1 (lm head))*"])


def test_a_correct_pipeline_run_passes_with_its_updates_compared(pytester):
    write_config(pytester, [{"id": "pp2", "models": ["gpt2", "llama3"],
                             "args": {"pipeline_parallel": 2}}])
    result = run(pytester)
    result.assert_outcomes(passed=2)
    for name in ("e2e/gpt2/pp2", "e2e/llama3/pp2"):
        updates = records(pytester)[name]["gradients"]["parameter_updates"]
        assert updates["ok"] and not updates["missing"] and not updates["extra"]
        # the run's own paths are not among the flags: two records of one layout group
        # would never group (the report's "Layout throughput" vanished so)
        assert "dump_parameter_updates" not in records(pytester)[name]["flags"]
