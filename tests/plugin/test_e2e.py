"""End to end on CPU through the real trainer and torchrun (slow): a tiny tag passes, and a bug
planted in the launched processes (never in the trainer's code) fails with the right stage and
parameters named."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from .conftest import plugin_args

pytestmark = pytest.mark.slow
pytest.importorskip("harness.trainer.parallel.engine")
pytest.importorskip("harness.assets")

CASES = [
    {"id": "pp2-partition-3-5", "args": {"pipeline_parallel": 2, "pipeline_layer_partition": "3,5"}},
    {"id": "tp2", "models": ["llama3"], "args": {"tensor_parallel": 2}},
]
DEFAULTS = {"batch_size": 2, "sequence_length": 32, "total_batch_size": 256, "num_iteration": 3,
            "learning_rate": 0.001}

# Scales two of layer 5's gradients on pipeline stage 1 after every backward: the kind of
# stage-local mistake (a wrong loss scale, a missed reduction) the harness exists to catch.
PLANTED_BUG = textwrap.dedent("""
    import os
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from harness.trainer.parallel import engine

        original = engine.ParallelEngine.forward_backward

        def forward_backward(self, inputs, targets):
            if os.environ.get("HARNESS_CASE", "").endswith("-crash") and self.world.pp_rank == 1:
                raise RuntimeError("planted crash on pipeline stage 1")
            loss = original(self, inputs, targets)
            if self.world.pp_rank == 1:
                for _spec, module in self.chunks:
                    for name, p in module.named_parameters():
                        if name in ("h.5.attn.c_proj.weight", "h.5.mlp.c_fc.weight") and p.grad is not None:
                            p.grad.mul_(1.5)
            return loss

        engine.ParallelEngine.forward_backward = forward_backward
""")


def write_config(pytester, cases, env=None):
    data = {"models": ["gpt2", "llama3"], "defaults": DEFAULTS,
            "test_groups": [{"tag": "e2e", "tests": cases}]}
    if env:
        data["trainer"] = {"env": env}
    (pytester.path / "cases.json").write_text(json.dumps(data))


def run(pytester, *more):
    return pytester.runpytest_subprocess(
        *plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
        "--harness-output", str(pytester.path / "out"), "--harness-device", "cpu",
        "--gpus", "2", "--harness-timeout", "300", "-p", "no:cacheprovider", "-m", "e2e", *more,
        timeout=900)


def records(pytester):
    path = next((pytester.path / "out").glob("sessions/*/results.jsonl"))
    return {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_a_pipeline_case_passes_through_torchrun(pytester):
    # One case: torchrun's ~12 s start per process group is the cost; LLaMA 3 and TP through
    # torchrun are tests/trainer/parallel/test_e2e.py's, the tag's other cases run under the
    # zygote in configs/test_config.json.
    write_config(pytester, CASES)
    result = run(pytester, "--harness-launcher", "torchrun", "-k", "gpt2")  # CPU's default: zygote
    result.assert_outcomes(passed=1)
    for record in records(pytester).values():
        assert record["status"] == "passed"
        assert record["loss"]["steps"] == 3 and record["loss"]["mismatched"] == 0
        assert record["gradients"]["mismatched"] == 0 and not record["gradients"]["missing"]
        assert record["tokens_per_s"] > 0 and record["peak_memory_mb"] > 0
        assert record["environment"]["world_size"] == 2
        assert record["command"][1:3] == ["-m", "torch.distributed.run"]
        ranks = record["logs"]["ranks"]
        assert sorted(ranks) == ["0", "1"], ranks  # every rank's stdout and stderr, recorded
        assert all([p.rsplit("/", 1)[1] for p in ranks[r]] == ["stdout.log", "stderr.log"]
                   for r in ranks) and all(os.path.isfile(p) for r in ranks for p in ranks[r])
        assert record["parallel"]["vpp"] == record["layout"]["vpp"] == 1


def test_planted_bug_fails_naming_stage_and_parameters(pytester):
    shim = pytester.mkdir("shim")
    (shim / "sitecustomize.py").write_text(PLANTED_BUG)
    crash = {"id": "pp2-crash", "models": ["gpt2"], "args": {"pipeline_parallel": 2}}
    write_config(pytester, CASES[:1] + [crash], env={"PYTHONPATH": str(shim)})
    result = run(pytester, "-k", "gpt2")
    result.assert_outcomes(failed=2)
    # A crashed rank: the message names it and shows its own log's tail, ending in the error.
    result.stdout.fnmatch_lines([
        "*e2e/gpt2/pp2-crash: the run failed: rank 1 of 2 failed first; exit code 1*",
        "command: * -m torch.distributed.run *",
        "*--- rank 1: */attempt_0/1/stderr.log (last lines) ---*",
        "*RuntimeError: planted crash on pipeline stage 1*",
    ])
    crashed = records(pytester)["e2e/gpt2/pp2-crash"]
    assert crashed["failing_rank"] == "1" and sorted(crashed["logs"]["ranks"]) == ["0", "1"]
    result.stdout.fnmatch_lines([
        "*e2e/gpt2/pp2-partition-3-5: the run differs from the single-device reference*",
        "*loss: mismatched * of 3 steps (atol=1e-05 rtol=0); first diverging step 2*",
        "*gradients: mismatched 2 of 100 parameters*",
        "*worst parameters:*",
    ])
    table = result.stdout.str()
    for name in ("h.5.attn.c_proj.weight", "h.5.mlp.c_fc.weight"):
        row = next(line for line in table.splitlines() if line.strip().startswith(name))
        assert row.split()[1:3] == ["1", "5"], row  # stage 1, layer 5
    record = records(pytester)["e2e/gpt2/pp2-partition-3-5"]
    assert {w["name"] for w in record["gradients"]["worst"]} == {
        "h.5.attn.c_proj.weight", "h.5.mlp.c_fc.weight"}
    assert record["loss"]["first_diverging_step"] == 2


def test_a_trusted_topology_can_be_the_reference(pytester):
    """Where one device cannot hold the model, a group names a trusted topology as its
    reference: the reference runs on it (TP 2 here), the case (PP 2) is compared against it."""
    data = {"models": ["gpt2"], "defaults": DEFAULTS,
            "test_groups": [{"tag": "e2e", "reference": {"tensor_parallel": 2},
                             "tests": CASES[:1]}]}
    (pytester.path / "cases.json").write_text(json.dumps(data))
    result = run(pytester)
    result.assert_outcomes(passed=1)
    record = records(pytester)["e2e/gpt2/pp2-partition-3-5"]
    assert record["reference"]["topology"] == {"tensor_parallel": 2}
    assert record["reference"]["key"]["flags"]["reference_world_size"] == 2
    assert "--tensor_parallel=2" in record["reference"]["command"]
    assert "--pipeline_parallel=2" not in record["reference"]["command"]
    assert record["gradients"]["mismatched"] == 0 and record["gradients"]["parameters"] == 100
