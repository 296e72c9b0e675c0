"""Multi-node cases (harness.launch.multinode): placement, agents' faults, and end to end two
torchrun agents on this machine forming one gloo world, with the verdicts of one node."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.launch.multinode import (
    NodePlan,
    global_ranks,
    node_rank_logs,
    placement_problem,
    plan_nodes,
    run_agents,
)
from tests.reliability.checks import alive


def settings(slots=2, nnodes=1, nproc_per_node=None, scheduler="local"):
    return SimpleNamespace(slots=slots, nnodes=nnodes, nproc_per_node=nproc_per_node,
                           scheduler=scheduler)


def test_plan_spreads_over_nodes_of_nproc_each():
    assert plan_nodes(2, settings(slots=2, nnodes=2)) == NodePlan(2, 1)
    assert plan_nodes(1, settings(slots=2, nnodes=2)) == NodePlan(1, 1)
    assert plan_nodes(8, settings(slots=8, nnodes=2)) == NodePlan(2, 4)
    assert plan_nodes(4, settings(slots=8, nnodes=2)) == NodePlan(1, 4)
    # On Slurm a node has --gpus devices: 16 ranks are 2 nodes of 8.
    assert plan_nodes(16, settings(slots=8, nnodes=2, scheduler="slurm")) == NodePlan(2, 8)


def test_placement_problems_are_skip_reasons():
    assert "--harness-nnodes allows 2" in plan_nodes(17, settings(slots=8, nnodes=2,
                                                                  scheduler="slurm"))
    assert "do not split evenly" in plan_nodes(3, settings(slots=4, nnodes=2))
    assert placement_problem(4, settings(slots=2, nnodes=2), False) == \
        "it needs 4 devices, but --gpus allows 2"
    assert "only the bundled trainer" in placement_problem(2, settings(slots=2, nnodes=2), True)
    assert placement_problem(2, settings(slots=2, nnodes=2), False) is None


def test_global_ranks_and_rank_logs_follow_the_rendezvous(tmp_path):
    # The c10d rendezvous may give node 0 the higher ranks: logs are keyed by global rank.
    (tmp_path / "launcher.node0.stderr").write_text(
        "I... Rendezvous complete for workers. Result:\n  restart_count=0\n  group_rank=1\n"
        "  group_world_size=2\n  local_ranks=[0]\n  role_ranks=[1]\n  global_ranks=[1]\n")
    (tmp_path / "launcher.node1.stderr").write_text("group_rank=0\n global_ranks=[0]\n")
    assert global_ranks(tmp_path / "launcher.node0.stderr") == [1]
    for node in (0, 1):
        log = tmp_path / "ranks" / f"node{node}" / "id_x" / "attempt_0" / "0" / "stderr.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"node {node}")
    (tmp_path / "nodes.json").write_text(json.dumps({"nodes": [
        {"node": 0, "global_ranks": [1]}, {"node": 1, "global_ranks": [0]}]}))
    logs = node_rank_logs(tmp_path)
    assert logs["1"][0].read_text() == "node 0" and logs["0"][0].read_text() == "node 1"


def test_a_lost_node_is_reported_and_no_agent_is_left(tmp_path):
    pids = tmp_path / "pids"
    survivor = [sys.executable, "-c",
                f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
                "time.sleep(120)"]
    # The lost agent's rank, started in a session of its own as torch 2.13's torchrun does:
    # killing the agent's process group does not reach it; its reaper must.
    orphan = tmp_path / "orphan"
    lost = [sys.executable, "-c", "import os, signal, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            f"start_new_session=True); open({str(orphan)!r}, 'w').write(str(c.pid)); "
            "time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"]
    # Stopped by the lost node, not the 60 s timeout (how fast: benchmarks/timing_bounds.py).
    result = run_agents([survivor, lost], [dict(os.environ)] * 2, 60, tmp_path, grace_s=1.0)
    assert not alive(int(orphan.read_text()))
    assert result.fault == ("node 1 lost: its torchrun agent was killed by SIGKILL; the other "
                            "agents were stopped")
    assert not result.ok and not result.timed_out
    assert all(not alive(int(p)) for p in pids.read_text().split())
    record = json.loads((tmp_path / "nodes.json").read_text())
    assert record["first_failure"] == 1 and record["nodes"][1]["returncode"] == -9
    merged = (tmp_path / "launcher.stdout").read_text()
    assert merged.index("node 0") < merged.index("node 1")  # the failing node last


def test_agents_past_the_timeout_are_all_killed(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    result = run_agents([sleeper, sleeper], [dict(os.environ)] * 2, 1.0, tmp_path)
    assert result.timed_out and result.returncode is None and result.fault is None


# ---------------------------------------------------------------------------- end to end

# A gradient bug on pipeline stage 1 (as tests/plugin/test_e2e.py plants it), only in the
# cases named "*-bug", and a crash of stage 1 in "*-crash". Installed when the interpreter
# starts and decided per call, from the rank's own environment: so the zygote, which starts
# once and forks its ranks later, plants it as torchrun's ranks do.
PLANTED = textwrap.dedent("""
    import os
    try:
        from harness.trainer.parallel import engine
    except Exception:  # not the harness's interpreter: nothing to plant
        engine = None
    if engine is not None:
        original = engine.ParallelEngine.forward_backward
        def forward_backward(self, inputs, targets):
            case = os.environ.get("HARNESS_CASE", "")
            planted = int(os.environ.get("WORLD_SIZE", "1")) > 1 and self.world.pp_rank == 1
            if planted and case.endswith("-crash"):
                raise RuntimeError("planted crash on pipeline stage 1")
            loss = original(self, inputs, targets)
            if planted and case.endswith("-bug"):
                for _spec, module in self.chunks:
                    for name, p in module.named_parameters():
                        if name == "h.5.mlp.c_fc.weight" and p.grad is not None:
                            p.grad.mul_(1.5)
            return loss
        engine.ParallelEngine.forward_backward = forward_backward
""")
E2E_CASES = [
    {"id": "pp2", "args": {"pipeline_parallel": 2}},
    {"id": "pp2-bug", "args": {"pipeline_parallel": 2}},
    {"id": "pp2-crash", "args": {"pipeline_parallel": 2}},
]
DEFAULTS = {"batch_size": 2, "sequence_length": 32, "total_batch_size": 256, "num_iteration": 3,
            "learning_rate": 0.001}


def _records(out: Path) -> dict[str, dict]:
    """The one session's result records under `out`, by case name."""
    from harness.results import read_results

    return {r["name"]: r for r in read_results(next(out.glob("sessions/*/results.jsonl")))}


def _verdicts(out: Path) -> dict:
    found = {}
    for record in _records(out).values():
        grads = record.get("gradients") or {}
        found[record["name"]] = (record["status"], record.get("failing_rank"),
                                 (record.get("loss") or {}).get("mismatched"),
                                 grads.get("mismatched"),
                                 tuple(sorted(w["name"] for w in grads.get("worst") or [])))
    return found


@pytest.mark.slow
def test_two_agents_form_one_world_with_the_verdicts_of_one_node(pytester, monkeypatch):
    pytest.importorskip("harness.trainer.parallel.engine")
    from tests.plugin.conftest import plugin_args

    shim = pytester.mkdir("shim")
    (shim / "sitecustomize.py").write_text(PLANTED)
    # The plant on the sessions' own PYTHONPATH: the one-node session's zygote and the agents'
    # ranks load it alike.
    monkeypatch.setenv("PYTHONPATH", str(shim))
    (pytester.path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"], "defaults": DEFAULTS,
        "test_groups": [{"tag": "mn", "tests": E2E_CASES}]}))
    common = [*plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
              "--harness-device", "cpu", "--gpus", "2", "--harness-timeout", "300",
              "--harness-reference-cache", str(pytester.path / "refs"), "-p", "no:cacheprovider"]
    one = pytester.runpytest_subprocess(*common, "--harness-output", str(pytester.path / "one"),
                                        timeout=900)
    one.assert_outcomes(passed=1, failed=2)
    two = pytester.runpytest_subprocess(*common, "--harness-output", str(pytester.path / "two"),
                                        "--harness-nnodes", "2", timeout=900)
    two.assert_outcomes(passed=1, failed=2)
    single, multi = _verdicts(pytester.path / "one"), _verdicts(pytester.path / "two")
    assert multi == single
    # one node: the zygote's ranks
    assert "harness.launch.zygote" in _records(pytester.path / "one")["mn/gpt2/pp2"]["command"]
    assert single["mn/gpt2/pp2-bug"][3] >= 1 and single["mn/gpt2/pp2-crash"][1] == "1"
    two.stdout.fnmatch_lines([
        "*mn/gpt2/pp2-crash: the run failed: rank 1 of 2 failed first; exit code 1*",
        "*--rdzv-endpoint 127.0.0.1:* --rdzv-id mn-gpt2-pp2-crash-*",
        "*--- rank 1: */ranks/node*/attempt_0/0/stderr.log (last lines) ---*",
        "*RuntimeError: planted crash on pipeline stage 1*",
    ])
    passed = _records(pytester.path / "two")["mn/gpt2/pp2"]
    assert passed["environment"]["world_size"] == 2 and "--nnodes" in passed["command"]
    assert passed["command"][passed["command"].index("--nnodes") + 1] == "2"
    assert sorted(passed["logs"]["ranks"]) == ["0", "1"]
    logs = Path(passed["output_dir"]) / "logs"
    nodes = json.loads((logs / "nodes.json").read_text())["nodes"]
    assert sorted(r for n in nodes for r in n["global_ranks"]) == [0, 1]
    assert all(n["returncode"] == 0 for n in nodes)
