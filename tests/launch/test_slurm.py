"""The Slurm scheduler (harness.launch.slurm) against a real one-node Slurm started here
(tests/launch/slurm_cluster.py): faults reported as such with no job left behind, and cases
end to end through `--harness-scheduler slurm` with the verdicts of local runs. Skipped, with
the reason, where Slurm cannot start."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.launch import CommandBackend, LaunchSpec
from harness.launch.multinode import NodePlan
from harness.launch.slurm import SlurmScheduler, _exit_code, parse_job

from tests.reliability.checks import alive

from .slurm_cluster import SlurmUnavailable


def test_scontrol_lines_and_exit_codes_parse():
    info = parse_job("JobId=7 JobName=harness:x JobState=NODE_FAIL Reason=NodeDown "
                     "ExitCode=0:9 NodeList=n[1-2] TimeLimit=00:16:00")
    assert info["JobState"] == "NODE_FAIL" and info["NodeList"] == "n[1-2]"
    assert _exit_code("1:0") == 1 and _exit_code("0:9") == -9 and _exit_code("") is None


def test_jobs_are_sized_from_the_case(tmp_path):
    spec = _spec(tmp_path, "sized", world_size=16)
    spec.device = "cuda"
    argv = SlurmScheduler(900, 900, ("--partition=gpu",)).sbatch_argv(
        spec, NodePlan(2, 8), tmp_path / "job.sh")
    assert "--nodes=2" in argv and "--gpus-per-node=8" in argv and "--time=16" in argv
    assert "--cpus-per-task=8" in argv  # a CPU per rank on CUDA too
    assert "--job-name=harness" in argv and "--comment=slurm/fake/sized" in argv
    assert argv[-2:] == ["--partition=gpu", str(tmp_path / "job.sh")]


def test_without_slurm_the_reason_is_given(monkeypatch):
    from . import slurm_cluster

    monkeypatch.setattr(slurm_cluster, "_have", lambda tool: tool != "slurmctld")
    monkeypatch.setenv("HARNESS_SLURM_INSTALL", "0")
    with pytest.raises(SlurmUnavailable, match="slurmctld not installed"):
        slurm_cluster.ensure_installed()


def _spec(tmp_path, name, world_size=1):
    out = tmp_path / name
    return LaunchSpec(case=f"slurm/fake/{name}", model="gpt2", flags={}, world_size=world_size,
                      checkpoint=tmp_path / "c.bin", input_bin=tmp_path / "t.bin",
                      output_dir=out, gradients_dir=None, log_dir=out / "logs")


def _sleeper(seconds=120):
    return CommandBackend(["{python}", "-c", f"import time; print('started', flush=True); "
                           f"time.sleep({seconds})"], version="sleep")


def _run(slurm, tmp_path, name, backend, during=None, **options):
    scheduler = SlurmScheduler(**{"timeout_s": 60, "pending_timeout_s": 60, "poll_s": 0.3,
                                  "env": slurm.env, **options})
    spec = _spec(tmp_path, name)
    if during is not None:
        threading.Thread(target=during, args=(scheduler,), daemon=True).start()
    result = scheduler.run(backend, spec, NodePlan(1, 1))
    assert slurm.jobs() == [], f"job left behind: {slurm.jobs()}"
    return scheduler, spec, result


def _when_running(slurm, scheduler, action):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if scheduler.submitted and scheduler.job_info(scheduler.submitted[0]).get(
                "JobState") == "RUNNING":
            time.sleep(0.5)
            action(scheduler.submitted[0])
            return
        time.sleep(0.2)


def test_a_job_runs_and_its_output_comes_back(slurm, tmp_path):
    backend = CommandBackend(["{python}", "-c", "import sys; print('hello from the job'); "
                              "sys.exit(3)"], version="exit3")
    _, spec, result = _run(slurm, tmp_path, "exit3", backend)
    assert result.returncode == 3 and result.fault is None and not result.timed_out
    assert "hello from the job" in result.stdout.read_text()
    nodes = json.loads((spec.log_dir / "nodes.json").read_text())
    assert nodes["slurm_job"] == result.job.job_id
    # The node's exit code as its reaper wrote it, not the job's copied to every node.
    assert nodes["nodes"][0]["returncode"] == 3 and nodes["returncode_source"] == ["node"]
    assert nodes["first_failure"] == 0
    assert result.argv[0] == sys.executable  # the command the node ran
    job = result.job
    assert job.scheduler == "slurm" and job.nodes == 1 and job.node_list == slurm.node
    assert job.queue_s is not None and job.queue_s >= 0 and job.run_s is not None
    assert result.run_s == job.run_s <= result.duration_s


def test_a_job_shape_that_can_never_start_is_refused_at_once(slurm, tmp_path):
    started = time.monotonic()
    scheduler = SlurmScheduler(timeout_s=600, pending_timeout_s=600, poll_s=0.3, env=slurm.env)
    result = scheduler.run(_sleeper(), _spec(tmp_path, "wide", world_size=2), NodePlan(2, 1))
    assert time.monotonic() - started < 60  # not the 600 s the queue wait may take
    assert slurm.jobs() == []
    assert not result.ok and result.fault
    assert ("can never start: PENDING (reason: PartitionNodeLimit" in result.fault
            or "sbatch refused the job" in result.fault), result.fault


def test_a_rank_in_its_own_session_is_ended_with_the_job(slurm, tmp_path):
    """Slurm's proctrack/linuxproc (the test cluster's, and a common one) follows parent links
    only: a rank torchrun started with start_new_session outlives its agent unless the node's
    reaper ends it."""
    pid_file = tmp_path / "orphan.pid"
    backend = CommandBackend(["{python}", "-c", (
        "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(300)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))")], version="orphan")
    _, spec, result = _run(slurm, tmp_path, "orphan", backend)
    assert result.returncode == 0, result.stderr.read_text()
    assert not alive(int(pid_file.read_text()))
    assert "reaper: ended 1 process(es) of the run" in (
        spec.log_dir / "launcher.node0.stderr").read_text()


def test_a_job_pending_past_the_timeout_is_cancelled_and_reported(slurm, tmp_path):
    _, _, result = _run(slurm, tmp_path, "held", _sleeper(), pending_timeout_s=3,
                        extra_args=("--hold",))
    assert result.fault and "never started: still PENDING (reason: JobHeldUser)" in result.fault
    assert "it was cancelled" in result.fault and not result.ok


def test_a_run_past_the_timeout_is_cancelled(slurm, tmp_path):
    _, _, result = _run(slurm, tmp_path, "slow", _sleeper(), timeout_s=3)
    assert result.timed_out and "was cancelled (scancel)" in result.fault


def test_a_job_cancelled_while_pending_is_no_good_run(slurm, tmp_path):
    """Cancelled before it started, a job's exit code is 0: the fault alone says it failed."""
    cancel = lambda s: _when_pending(s, lambda job: slurm.run("scancel", job))  # noqa: E731
    _, _, result = _run(slurm, tmp_path, "cancelled-pending", _sleeper(), during=cancel,
                        extra_args=("--hold",))
    assert "was cancelled (not by the harness" in result.fault and not result.ok


def _when_pending(scheduler, action):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if scheduler.submitted:
            action(scheduler.submitted[0])
            return
        time.sleep(0.1)


def test_a_job_is_cancelled_when_its_submitter_is_killed(slurm, tmp_path):
    """pytest (or an xdist worker) killed by SIGKILL runs no handler: the job's guard sees its
    pipe close and cancels the job."""
    submitter = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
        "from pathlib import Path; "
        "from harness.launch.multinode import NodePlan; "
        "from harness.launch.slurm import SlurmScheduler; "
        "from tests.launch.test_slurm import _sleeper, _spec; "
        "SlurmScheduler(60, 600, ('--hold',), poll_s=0.3).run("
        f"_sleeper(), _spec(Path({str(tmp_path)!r}), 'orphaned-job'), NodePlan(1, 1))")
    process = subprocess.Popen([sys.executable, "-c", submitter], env=slurm.env)
    try:
        deadline = time.monotonic() + 60
        while not slurm.jobs():
            assert process.poll() is None and time.monotonic() < deadline, "nothing submitted"
            time.sleep(0.1)
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 30
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm.jobs() == [], "the job of a killed submitter was left in the queue"
    assert "the submitter of Slurm job" in next(tmp_path.glob("**/job_guard.stderr")).read_text()


def test_a_job_cancelled_from_outside_is_reported_as_cancelled(slurm, tmp_path):
    cancel = lambda s: _when_running(slurm, s, lambda job: slurm.run("scancel", job))  # noqa: E731
    _, _, result = _run(slurm, tmp_path, "cancelled", _sleeper(), during=cancel)
    assert "was cancelled (not by the harness" in result.fault and not result.ok


def test_a_lost_node_is_reported_as_such(slurm, tmp_path):
    def down(job):
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=down",
                  "reason=harness-test-node-lost")

    try:
        _, _, result = _run(slurm, tmp_path, "lost", _sleeper(),
                            during=lambda s: _when_running(slurm, s, down))
    finally:
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and slurm.run(
                "sinfo", "-h", "-o", "%t", check=False).strip() not in ("idle", "mix"):
            time.sleep(0.3)
    assert result.fault and result.fault.startswith("node lost: Slurm job"), result.fault
    assert "NODE_FAIL" in result.fault


# ---------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_cases_run_through_slurm_with_the_local_verdicts(slurm, pytester, monkeypatch):
    pytest.importorskip("harness.trainer.parallel.engine")
    from tests.plugin.conftest import plugin_args

    from .test_multinode import DEFAULTS, PLANTED

    shim = pytester.mkdir("shim")
    (shim / "sitecustomize.py").write_text(PLANTED)
    cases = [{"id": "pp2", "args": {"pipeline_parallel": 2}},
             {"id": "pp2-bug", "args": {"pipeline_parallel": 2}},
             {"id": "pp2-crash", "args": {"pipeline_parallel": 2}}]
    (pytester.path / "cases.json").write_text(json.dumps({
        "models": ["gpt2"], "defaults": DEFAULTS, "trainer": {"env": {"PYTHONPATH": str(shim)}},
        "test_groups": [{"tag": "sl", "tests": cases}]}))
    for name, value in slurm.env.items():
        if name.startswith("SLURM"):
            monkeypatch.setenv(name, value)
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess(
        *plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
        "--harness-output", str(out), "--harness-device", "cpu", "--gpus", "2",
        "--harness-timeout", "300", "--harness-scheduler", "slurm", "-p", "no:cacheprovider",
        timeout=900)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*sl/gpt2/pp2-bug: the run differs from the single-device reference*",
        "*gradients: mismatched * parameters*"])
    # The failing rank named as on one machine, from the node's own exit code and log.
    result.stdout.fnmatch_lines(["*sl/gpt2/pp2-crash: the run failed: rank 1 of 2 failed first*"])
    records = {r["name"]: r for r in map(json.loads, next(out.glob(
        "sessions/*/results.jsonl")).read_text().splitlines())}
    passed = records["sl/gpt2/pp2"]
    assert passed["environment"]["world_size"] == 2 and sorted(passed["logs"]["ranks"]) == ["0", "1"]
    logs = Path(passed["output_dir"]) / "logs"
    assert json.loads((logs / "nodes.json").read_text())["slurm_job"] == passed["job"]["job_id"]
    assert passed["devices"] is None  # Slurm's devices, never leased here
    assert passed["job"]["nodes"] == 1 and passed["timings"]["queue_s"] >= 0
    assert passed["timings"]["run_s"] == passed["job"]["run_s"]
    reference = Path(passed["reference"]["path"]) / "logs"
    assert (reference / "slurm-job").is_file()  # the reference was a job too
    crashed = json.loads((Path(records["sl/gpt2/pp2-crash"]["output_dir"]) / "logs" /
                          "nodes.json").read_text())
    assert crashed["first_failure"] == 0 and crashed["returncode_source"] == ["node"]
    assert crashed["nodes"][0]["returncode"] == 1 and records["sl/gpt2/pp2-crash"]["failing_rank"] == "1"
    assert slurm.jobs() == []


def test_sigterm_cancels_the_running_job_and_keeps_the_finished(slurm, pytester, monkeypatch):
    """SIGTERM (what `timeout` and CI send) to a session on Slurm: the finished case is kept,
    the report command printed, the running job cancelled and waited for, and the trainer's
    processes on the node ended (by pid)."""
    from tests.plugin.conftest import fake_config, harness_args
    from tests.reliability.checks import assert_no_process_left, interrupt_when, jsonl

    (pytester.path / "cases.json").write_text(json.dumps(fake_config(
        [{"id": "ok", "args": {}}, {"id": "hang", "args": {}}])))
    for name in ("gpt2.bin", "gpt2_tokens.bin", "llama3.bin", "llama3_tokens.bin"):
        (pytester.path / name).write_bytes(b"dummy" * 8)  # the fake trainer reads none
    records = pytester.mkdir("records")
    env = {**slurm.env, "FAKE_RECORD_DIR": str(records)}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", *harness_args(pytester, "--harness-scheduler", "slurm",
                                                       "--harness-timeout", "120")],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    def running() -> bool:
        if not any(r.get("child") for r in jsonl(records / "pids.jsonl")):
            return False
        assert slurm.jobs(), "the hanging case is no Slurm job"
        return True

    interrupt_when(session, running, signal.SIGTERM)
    assert slurm.jobs() == [], f"left in the queue: {slurm.jobs()}"
    assert_no_process_left(records, within_s=10)
    results = {r["name"]: r for r in jsonl(next((pytester.path / "out").glob(
        "sessions/*/results.jsonl")))}
    assert results["fake/gpt2/ok"]["status"] == "passed" and "fake/gpt2/hang" not in results


def test_node_exit_codes_come_from_the_nodes_then_srun_else_unknown(tmp_path):
    from harness.launch.slurm import node_exit_codes

    (tmp_path / "launcher.node1.exit.json").write_text('{"returncode": 0, "ended": 10.0}')
    (tmp_path / "launcher.node2.exit.json").write_text('{"returncode": 1, "ended": 12.0}')
    (tmp_path / "launcher.node3.exit.json").write_text('{"returncode": -6, "ended": 11.0}')
    batch = tmp_path / "slurm-7.out"
    batch.write_text("srun: error: n0: task 0: Exited with exit code 2\n"
                     "srun: error: n2: task 2: Exited with exit code 9\n"  # node 2's own wins
                     "srun: error: n4: task 4: Some other wording\n")  # no code made up
    codes, sources, first = node_exit_codes(tmp_path, 5, batch)
    assert codes == [2, 0, 1, -6, None]
    assert sources == ["srun", "node", "node", "node", "unknown"]
    assert first == 3  # the earliest of the failing nodes that wrote when they ended
    assert node_exit_codes(tmp_path / "none", 2, tmp_path / "none.out") == (
        [None, None], ["unknown", "unknown"], None)
