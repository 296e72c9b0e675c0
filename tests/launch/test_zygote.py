"""The zygote launcher against torchrun: bit-identical results, the same failure reports, no
process left behind, and a zygote that dies is started again (the run is not skipped)."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from harness.launch.zygote import (
    Zygote,
    shared_zygote,
    startup_environment_differs,
)
from harness.runner.diagnosis import tail
from tests.reliability.checks import alive, jsonl

pytestmark = pytest.mark.slow


def _dump(out):
    """{relative path: bytes} of a run's gradient dump, and its step records minus timings."""
    files = {str(p.relative_to(out)): p.read_bytes()
             for p in sorted((out / "gradients").rglob("*")) if p.is_file()}
    steps = [{k: v for k, v in json.loads(line).items()
              if k not in ("step_time_ms", "tokens_per_s", "peak_memory_mb")}
             for line in (out / "steps.jsonl").read_text().splitlines()]
    return files, steps


def test_the_zygote_is_one_thread_with_torch_and_the_trainer_imported():
    zygote = Zygote()
    try:
        zygote.start()
        assert zygote.info["threads"] == 1, zygote.info
        assert zygote.info["missing"] == [], zygote.info
        assert zygote.ping()["threads"] == 1
    finally:
        zygote.close()
    assert zygote.process is None


def test_startup_variables_decide_whether_a_zygote_can_serve():
    base = {"PATH": "/bin", "PYTHONPATH": "/a"}
    assert not startup_environment_differs({**base, "RANK": "1", "PYTHONUNBUFFERED": "1"}, base)
    assert startup_environment_differs({**base, "PYTHONPATH": "/b"}, base)
    assert startup_environment_differs({**base, "LD_PRELOAD": "x.so"}, base)


def test_pp2_results_are_bit_identical_under_torchrun_and_the_zygote(launch):
    results = {}
    for launcher in ("torchrun", "zygote"):
        spec, result = launch(launcher)
        assert result.ok, (launcher, tail(result.stderr, 40))
        results[launcher] = _dump(spec.output_dir)
        ranks = launch.backend.rank_logs(spec, result)
        assert sorted(ranks) == ["0", "1"], (launcher, ranks)
        assert all(sorted(p.name for p in ranks[r]) == ["stderr.log", "stdout.log"] for r in ranks)
    files, steps = results["zygote"]
    assert len(steps) == FLAGS_STEPS and len([f for f in files if f.endswith(".npy")]) > 50
    assert set(files) == set(results["torchrun"][0])
    for name in files:  # byte for byte, every gradient and the manifest
        assert files[name] == results["torchrun"][0][name], name
    assert steps == results["torchrun"][1]


FLAGS_STEPS = 4


def test_a_single_process_run_is_the_launchers_own_output(launch):
    spec, result = launch("zygote", world_size=1)
    assert result.ok, tail(result.stderr, 40)
    assert "step    4/4" in result.stdout.read_text()
    assert launch.backend.rank_logs(spec, result) == {}  # as `python -m harness.trainer`
    assert result.argv[1:4] == ("-m", "harness.launch.zygote", "run")


def _report(launch, launcher, case_id, **kwargs):
    spec, result = launch(launcher, case_id, **kwargs)
    logs = launch.backend.rank_logs(spec, result)
    failing = launch.backend.failing_rank(spec, result)
    text = "\n".join(tail(p, 25) for p in logs.get(failing, []))
    return result, failing, sorted(logs), text


def _no_process_left(records):
    pids = {r["pid"]: r for r in jsonl(records / "pids.jsonl")}
    assert pids, "the shim recorded no pids"
    left = {pid: r for pid, r in pids.items() if alive(pid)}
    assert not left, f"processes left behind: {left}"
    return pids


@pytest.mark.parametrize("fault", ["crash", "sigkill"])
def test_a_failing_rank_is_reported_as_under_torchrun(launch, planted, fault):
    reports = {launcher: _report(launch, launcher, fault) for launcher in ("torchrun", "zygote")}
    for launcher, (result, failing, ranks, text) in reports.items():
        assert not result.ok and not result.timed_out, launcher
        assert result.returncode == 1, (launcher, result.returncode)  # torchrun's own exit code
        assert failing == "1", (launcher, tail(result.stderr, 30))
        assert ranks == ["0", "1"], launcher
    if fault == "crash":
        for launcher, (_, _, _, text) in reports.items():
            assert text.rstrip().endswith("RuntimeError: planted crash on rank 1"), (launcher, text)
    else:
        zygote_stderr = reports["zygote"][0].stderr.read_text()
        assert "exitcode  : -9" in zygote_stderr and "Signal 9 (SIGKILL)" in zygote_stderr
    pids = _no_process_left(planted)
    assert {r["rank"] for r in pids.values()} == {0, 1}


def test_a_hung_rank_is_killed_with_its_children_at_the_timeout(launch, planted):
    spec, result = launch("zygote", "hang", timeout_s=15)
    assert result.timed_out and result.returncode is None  # killed, not waited out
    pids = _no_process_left(planted)
    assert any(r.get("child") for r in pids.values())  # the hang's own child is gone too
    assert sorted(launch.backend.rank_logs(spec, result)) == ["0", "1"]
    # The zygote survives a killed run and serves the next one.
    assert shared_zygote().alive()
    _, result = launch("zygote", "after-hang", timeout_s=120)
    assert result.ok, tail(result.stderr, 30)


def test_a_dead_zygote_is_started_again_and_the_run_is_not_skipped(launch, planted):
    zygote = shared_zygote()
    zygote.ensure()
    # Dead between runs: the next run starts a new one.
    os.kill(zygote.process.pid, signal.SIGKILL)
    zygote.process.wait()
    starts = zygote.starts
    spec, result = launch("zygote", "ok")
    assert result.ok and zygote.starts == starts + 1, tail(result.stderr, 30)
    # Dead during a run: its ranks go with it, a new one runs the case again.
    victim = zygote.process.pid
    killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
    killer.start()
    try:
        spec, result = launch("zygote", "slow")
    finally:
        killer.cancel()
    assert result.ok, tail(result.stderr, 30)
    assert zygote.starts == starts + 2
    assert f"the zygote (pid {victim}) died during the run" in result.stderr.read_text()
    assert "started a new one and ran again" in result.stderr.read_text()
    assert (spec.output_dir / "steps.jsonl").read_text().count("\n") == FLAGS_STEPS
    _no_process_left(planted)


def test_through_the_plugin_a_crash_is_reported_and_the_leases_are_free(pytester, planted,
                                                                         tiny_assets):
    """The whole path (collection, reference, lease, zygote, diagnosis, record) with the real
    trainer: the crash names rank 1 and ends with its traceback, as under torchrun."""
    from tests.plugin.conftest import plugin_args
    from tests.reliability.checks import assert_leases_free, the_session

    args = {k: v for k, v in FLAGS_CONFIG.items()}
    config = {"models": ["gpt2"], "defaults": args,
              "test_groups": [{"tag": "zy", "tests": [
                  {"id": "ok", "args": {"pipeline_parallel": 2}},
                  {"id": "crash", "args": {"pipeline_parallel": 2}}]}]}
    (pytester.path / "cases.json").write_text(json.dumps(config))
    result = pytester.runpytest(
        *plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
        "--harness-output", str(pytester.path / "out"), "--harness-device", "cpu",
        "--gpus", "2", "--harness-launcher", "zygote", "--harness-timeout", "300",
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*zy/gpt2/crash: the run failed: rank 1 of 2 failed first; exit code 1*",
        "command: * -m harness.launch.zygote run --nproc-per-node 2 *",
        "*--- rank 1: */attempt_0/1/stderr.log (last lines) ---*",
        "*RuntimeError: planted crash on rank 1*",
    ])
    session = the_session(pytester.path / "out")
    by_name = {r["name"]: r for r in jsonl(session / "results.jsonl")}
    assert by_name["zy/gpt2/crash"]["failing_rank"] == "1"
    assert by_name["zy/gpt2/ok"]["loss"]["mismatched"] == 0
    assert by_name["zy/gpt2/ok"]["gradients"]["mismatched"] == 0
    assert_leases_free(session)
    _no_process_left(planted)


FLAGS_CONFIG = {"batch_size": 2, "sequence_length": 32, "num_iteration": 4,
                "learning_rate": 0.001, "optimizer": "sgd", "total_batch_size": 512}
