"""Cases and reference builds as Slurm jobs (`--harness-scheduler slurm`; docs/slurm.md).

Each run (a case's, or a reference build, still once per key: the reference cache's file lock
lives on the shared folder) becomes one batch job sized from its NodePlan
(harness.launch.multinode): `--nodes N --ntasks-per-node 1 --cpus-per-task P`, plus
`--gpus-per-node P` on CUDA, `--time` from --harness-timeout, `--no-requeue` (a failed job is
reported, never rerun behind the harness's back), then --harness-slurm-args. Every job is named
`harness` (JOB_NAME; the case is its `--comment`), so `scancel --user "$USER" --name harness`
ends them all. The job script runs `srun` with one task per node, each `python -m
harness.launch.slurm <logs>/job.json`, which fills in the node's part of the command and runs
it under a reaper (harness.launch.reaper) that ends whatever it leaves and writes the node's
exit code: a torchrun agent per node for the bundled trainer (c10d rendezvous on the
allocation's first node, on a port that node's kernel hands out, shared through the run
folder), the trainer itself for one process, a command template's command as it is. Outputs
and logs go to the run's folder in the session folder, which must be on a filesystem every
node sees; each node's output is `logs/launcher.node<i>.stdout|stderr`, merged into the run's
launcher logs as for local agents (the first failing node last), so records, rank logs and
failure diagnosis are the local ones.

The submitting process polls `scontrol show job` and reports faults as such (ProcessResult.fault):
a job still pending past the timeout ("never started", with Slurm's reason), one whose pending
reason says it never can start (NEVER_STARTS: cancelled at once), a job cancelled by someone
else, a node lost (NODE_FAIL), Slurm's own time limit; a run past --harness-timeout is
cancelled (scancel) and reported as timed out. On every way out, an interrupt or SIGTERM
included, a job that has not ended is cancelled and waited for: no job is left behind. The
result carries the job (ProcessResult.job: id, nodes, time queued apart from time run).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.contracts.records import write_atomic

from .multinode import (
    NodePlan,
    agent_command,
    environment_without_slots,
    merge_node_logs,
    rdzv_id,
    write_nodes_record,
)
from .process import ProcessResult, SchedulerJob
from .reaper import exit_as, supervise

JOB_GUARD = Path(__file__).with_name("job_guard.py")

POLL_S = 1.0
CANCEL_WAIT_S = 60.0
PORT_WAIT_S = 300.0
JOB_NAME = "harness"  # every job's name: `scancel --user "$USER" --name harness` ends them all
# Pending reasons that no wait can cure: the job's shape exceeds a limit of its partition, QOS
# or association, or names something that does not exist. Such a job is cancelled at once.
NEVER_STARTS = {
    "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
    "InvalidQOS", "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit",
    "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "AssocMaxNodesPerJobLimit",
    "AssocMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit", "AssocMaxGRESPerJob",
}
# srun's own line for a task that failed, in the job script's output (another wording leaves
# the node's code unknown: no code is made up for it)
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (Exited with exit code (\d+)|"
                        r"Killed|Terminated)")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
STARTED = {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT"}


class SlurmError(RuntimeError):
    pass


@dataclass
class JobSeen:
    """What the polling of one job saw last: scontrol's fields and (queue_s, run_s)."""
    info: dict = field(default_factory=dict)
    times: tuple[float | None, float | None] = (None, None)


@dataclass
class SlurmScheduler:
    timeout_s: float  # running time, from the job's start; past it the job is cancelled
    pending_timeout_s: float  # time in the queue before it starts
    extra_args: tuple[str, ...] = ()
    poll_s: float = POLL_S
    env: dict[str, str] | None = None  # the environment sbatch / scontrol see (default: ours)
    submitted: list[str] = field(default_factory=list)

    @classmethod
    def from_settings(cls, settings) -> "SlurmScheduler":
        timeout = float(settings.timeout_s)
        return cls(timeout_s=timeout, pending_timeout_s=timeout,
                   extra_args=tuple(settings.slurm_args))

    # ------------------------------------------------------------------ the job

    def job_command(self, backend, spec, plan: NodePlan) -> list[str]:
        """The command each node runs, with {head}, {port} and {node} filled in on the node."""
        if backend.name == "harness":
            if spec.world_size == 1:
                return backend.command(spec)
            host = "{head}" if plan.nodes > 1 else "127.0.0.1"
            spec_id = rdzv_id(spec) if spec.port else re.sub(r"[^A-Za-z0-9_-]+", "-", spec.case)
            return agent_command(backend, spec, plan, host, "{port}", "{node}", spec_id)
        return backend.command(spec)  # a command template launches its own processes

    def script(self, spec, plan: NodePlan, job_file: Path) -> str:
        log_dir = spec.log_dir
        srun = ["srun", f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}",
                "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                f"--output={log_dir}/launcher.node%n.stdout",
                f"--error={log_dir}/launcher.node%n.stderr",
                sys.executable, "-m", "harness.launch.slurm", str(job_file)]
        return "\n".join([
            "#!/bin/bash",
            "# written by harness.launch.slurm: one task per node, each a torchrun agent",
            'HARNESS_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            "export HARNESS_RDZV_HOST",
            shlex.join(srun),
            "",
        ])

    def sbatch_argv(self, spec, plan: NodePlan, script: Path) -> list[str]:
        minutes = max(1, math.ceil(self.timeout_s / 60) + 1)
        # At least a CPU per rank on CUDA too: Slurm's default of one CPU a task would put all
        # of a node's ranks on one core (more: --harness-slurm-args --cpus-per-task=N, later wins).
        per_node = [f"--cpus-per-task={plan.nproc_per_node}"]
        if spec.device == "cuda":
            per_node.insert(0, f"--gpus-per-node={plan.nproc_per_node}")
        comment = re.sub(r"[^A-Za-z0-9_./:-]+", "-", spec.case)[:200]
        return ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--comment={comment}",
                f"--nodes={plan.nodes}",
                "--ntasks-per-node=1", *per_node, f"--time={minutes}", "--no-requeue",
                f"--output={spec.log_dir}/slurm-%j.out", f"--chdir={os.getcwd()}",
                *self.extra_args, str(script)]

    def run(self, backend, spec, plan: NodePlan) -> ProcessResult:
        log_dir = spec.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        env = environment_without_slots(backend.environment(spec))
        env.setdefault("LOGLEVEL", "INFO")  # torchrun agents log their global ranks
        job_file = log_dir / "job.json"
        template = [str(a) for a in self.job_command(backend, spec, plan)]
        job_file.write_text(json.dumps({"command": template, "nodes": plan.nodes,
                                        "cwd": str(backend.working_dir(spec) or "")}))
        script = log_dir / "job.sh"
        script.write_text(self.script(spec, plan, job_file))
        submit = self.sbatch_argv(spec, plan, script)
        submit_env = {**(self.env or os.environ), **env}
        started = time.monotonic()
        guard = self._guard(submit_env, log_dir)
        try:
            return self._submit_and_follow(spec, plan, template, submit, submit_env, started,
                                           guard)
        finally:  # the job has ended or was cancelled: the guard has nothing left to do
            try:
                guard.stdin.write(b"done\n")
                guard.stdin.close()
            except OSError:
                pass
            guard.wait()

    @staticmethod
    def _guard(env: dict, log_dir: Path) -> subprocess.Popen:
        """harness.launch.job_guard: cancels the job should this process die before it ends."""
        with open(log_dir / "job_guard.stderr", "ab") as err:
            return subprocess.Popen([sys.executable, "-I", "-S", str(JOB_GUARD)], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=err, start_new_session=True)

    def _submit_and_follow(self, spec, plan: NodePlan, template, submit, submit_env,
                           started: float, guard: subprocess.Popen) -> ProcessResult:
        log_dir = spec.log_dir
        done = subprocess.run(submit, env=submit_env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or not done.stdout.strip():
            message = (done.stderr.strip() or done.stdout.strip()).splitlines()
            return self._result(spec, plan, template, None, started, False,
                                f"sbatch refused the job: {message[-1] if message else '?'} "
                                f"(command: {shlex.join(submit)})")
        job = done.stdout.strip().split(";")[0]
        guard.stdin.write(f"job {job}\n".encode())
        guard.stdin.flush()
        self.submitted.append(job)
        (log_dir / "slurm-job").write_text(job + "\n")
        fault, timed_out, returncode = None, False, None
        ended = False
        seen = JobSeen()
        try:
            fault, timed_out, returncode, ended = self._follow(job, started, seen)
        finally:
            if not ended:  # an interrupt, an error, our timeout: no job is left behind
                self.cancel(job)
        return self._result(spec, plan, template, returncode, started, timed_out, fault, job,
                            seen)

    def _times(self, info: dict, submitted: float, running_since: float | None,
               ended: float) -> tuple[float | None, float | None]:
        """(queue_s, run_s): Slurm's own Submit / Start / End times where it gives them (whole
        seconds), else what the polling saw."""
        submit, start, end = (_slurm_time(info.get(k)) for k in ("SubmitTime", "StartTime",
                                                                  "EndTime"))
        started = info.get("JobState") in ENDED | STARTED and start is not None
        if submit is not None and started:
            run = end - start if end is not None and end >= start else None
            return max(0.0, start - submit), run
        if running_since is None:
            return None, None
        return running_since - submitted, ended - running_since

    def _follow(self, job: str, submitted: float, seen: JobSeen):
        """Wait for the job: (fault, timed_out, returncode, ended); `seen` keeps what the
        polling saw last, for the record."""
        running_since = None
        while True:
            info = self.job_info(job)
            if not info.get("_gone"):
                seen.info = info
            state = info.get("JobState", "UNKNOWN")
            now = time.monotonic()
            seen.times = self._times(seen.info, submitted, running_since, now)
            if state in ENDED or info.get("_gone"):
                return (*self._verdict(job, info), True)
            if state in STARTED:
                running_since = running_since or now
                if now - running_since > self.timeout_s:
                    self.cancel(job)
                    return (f"timed out after {self.timeout_s:g} s (--harness-timeout); Slurm "
                            f"job {job} was cancelled (scancel) with every process of the run",
                            True, None, True)
            elif running_since is not None:  # back in the queue: requeued after a failure
                self.cancel(job)
                return (f"node lost: Slurm job {job} was requeued after it started (now "
                        f"{state}, reason: {info.get('Reason', '?')}); it was cancelled",
                        False, None, True)
            elif info.get("Reason") in NEVER_STARTS:
                reason = info["Reason"]
                self.cancel(job)
                return (f"Slurm job {job} can never start: {state} (reason: {reason}: the job's "
                        f"shape is over a limit of its partition, QOS or account); it was "
                        f"cancelled at once", False, None, True)
            elif now - submitted > self.pending_timeout_s:
                reason = info.get("Reason", "?")
                self.cancel(job)
                return (f"Slurm job {job} never started: still {state} (reason: {reason}) "
                        f"{now - submitted:.0f} s after submission, past the timeout "
                        f"({self.pending_timeout_s:g} s); it was cancelled", False, None, True)
            time.sleep(self.poll_s)

    def _verdict(self, job: str, info: dict):
        state = info.get("JobState", "UNKNOWN")
        code = _exit_code(info.get("ExitCode", ""))
        nodes = info.get("NodeList", "?")
        if info.get("_gone"):
            return (f"Slurm job {job} left the queue without a final state (scontrol: "
                    f"{info.get('_error', '?')})", False, None)
        if state == "COMPLETED":
            return None, False, code if code is not None else 0
        if state == "FAILED":
            return None, False, code if code not in (None, 0) else 1
        if state == "CANCELLED":
            return (f"Slurm job {job} was cancelled (not by the harness: scancel or an "
                    f"administrator) on {nodes}", False, code)
        if state == "NODE_FAIL":
            return (f"node lost: Slurm job {job} ended NODE_FAIL (nodes {nodes}; reason: "
                    f"{info.get('Reason', '?')})", False, code)
        if state in ("TIMEOUT", "DEADLINE"):
            return (f"Slurm ended job {job} at its time limit ({info.get('TimeLimit', '?')})",
                    True, None)
        return (f"Slurm job {job} ended {state} (reason: {info.get('Reason', '?')}, exit "
                f"{info.get('ExitCode', '?')}) on {nodes}", False, code)

    def job_info(self, job: str) -> dict:
        done = subprocess.run(["scontrol", "show", "job", "-o", job], env=self.env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            error = done.stderr.strip()
            if "Invalid job id" in error:
                return {"_gone": True, "_error": error}
            raise SlurmError(f"scontrol show job {job}: {error}")
        return parse_job(done.stdout)

    def cancel(self, job: str) -> None:
        """scancel, then wait until the job has ended (its processes are gone)."""
        subprocess.run(["scancel", job], env=self.env, capture_output=True, timeout=60)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            info = self.job_info(job)
            if info.get("_gone") or info.get("JobState") in ENDED:
                return
            time.sleep(self.poll_s)

    def _result(self, spec, plan, template, returncode, started, timed_out, fault,
                job: str | None = None, seen: "JobSeen | None" = None) -> ProcessResult:
        log_dir = spec.log_dir
        batch = log_dir / f"slurm-{job}.out"
        argvs = []
        for node in range(plan.nodes):
            try:
                argvs.append(json.loads((log_dir / f"launcher.node{node}.argv.json").read_text()))
            except (OSError, ValueError):
                argvs.append(template)
        codes, sources, first = node_exit_codes(log_dir, plan.nodes, batch)
        stdout, stderr = merge_node_logs(log_dir, plan.nodes, first)
        if batch.is_file() and batch.stat().st_size:
            with open(stderr, "ab") as out:
                out.write(f"===== the job script: {batch.name} =====\n".encode())
                out.write(batch.read_bytes())
        seen = seen or JobSeen()
        info, (queue_s, run_s) = seen.info, seen.times
        write_nodes_record(log_dir, argvs, codes, first,
                           extra={"slurm_job": job, "returncode_source": sources})
        record = SchedulerJob("slurm", job, plan.nodes, info.get("NodeList"), queue_s, run_s)
        return ProcessResult(tuple(argvs[0]), returncode, timed_out,
                             time.monotonic() - started, stdout, stderr, fault=fault, job=record)


def parse_job(text: str) -> dict:
    """`scontrol show job -o` as a dict (the values of Key=Value pairs)."""
    info = {}
    for match in re.finditer(r"(\w[\w/:]*)=(\S*)", text):
        info.setdefault(match.group(1), match.group(2))
    return info


def _exit_code(text: str) -> int | None:
    match = re.match(r"(\d+):(\d+)", text or "")
    if not match:
        return None
    code, sig = int(match.group(1)), int(match.group(2))
    return -sig if sig and not code else code


def _slurm_time(text: str | None) -> float | None:
    """A `scontrol` time (2026-12-02T01:23:45, local time) as a Unix time; None for Unknown."""
    if not text or not re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", text):
        return None
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def node_exit_codes(log_dir: Path, nodes: int, batch: Path):
    """Each node's exit code, where it came from, and the first node to fail.

    First choice, data: the exit file each node's reaper wrote (`launcher.node<i>.exit.json`,
    with the time it ended: the first failing node is the earliest). Else srun's per-task line
    in the job script's output (`srun: error: n1: task 1: Exited with exit code 2`; one task a
    node). Else unknown (None), and said so: a node that never ran, or was lost with its files.
    """
    codes: list[int | None] = [None] * nodes
    sources = ["unknown"] * nodes
    ended: dict[int, float] = {}
    for node in range(nodes):
        try:
            data = json.loads((log_dir / f"launcher.node{node}.exit.json").read_text())
            codes[node], sources[node] = int(data["returncode"]), "node"
            ended[node] = float(data["ended"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    try:
        text = batch.read_text(errors="replace")
    except OSError:
        text = ""
    for match in _SRUN_TASK.finditer(text):
        code = int(match.group(4)) if match.group(4) else \
            -signal.SIGKILL if match.group(3) == "Killed" else -signal.SIGTERM
        for task in _task_list(match.group(2)):
            if task < nodes and codes[task] is None:
                codes[task], sources[task] = code, "srun"
    failing = [n for n in range(nodes) if codes[n] not in (None, 0)]
    timed = [n for n in failing if n in ended]
    first = min(timed, key=ended.get) if timed else (failing[0] if failing else None)
    return codes, sources, first


def _task_list(text: str) -> list[int]:
    tasks = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        tasks.extend(range(int(low), int(high or low) + 1))
    return tasks


def rendezvous_port(log_dir: Path, node: str, wait_s: float = PORT_WAIT_S) -> int:
    """The job's rendezvous port: the first node takes a free one from its kernel and writes
    it to `<logs>/rdzv-port` (the run folder is on a filesystem every node sees); the others
    read it. A port the kernel handed out is in no one else's use, 29500 included."""
    path = log_dir / "rdzv-port"
    if node == "0":
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        write_atomic(path, f"{port}\n")
        return port
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise SlurmError(f"{path}: node 0 never wrote the rendezvous port "
                                 f"({wait_s:g} s)") from None
            time.sleep(0.2)


def node_main(job_file: str) -> None:
    """On each node (an srun task): fill in this node's command and run it under a reaper,
    which ends every process it leaves (Slurm's proctrack/linuxproc loses the ranks torchrun
    starts in sessions of their own) and writes the node's exit code as data."""
    job = json.loads(Path(job_file).read_text())
    node = os.environ.get("SLURM_NODEID", "0")
    head = os.environ.get("HARNESS_RDZV_HOST") or "127.0.0.1"
    log_dir = Path(job_file).parent
    template = job["command"]
    port = rendezvous_port(log_dir, node) if any("{port}" in a for a in template) else 0
    argv = [a.replace("{head}", head).replace("{port}", str(port)).replace("{node}", node)
            for a in template]
    (log_dir / f"launcher.node{node}.argv.json").write_text(json.dumps(argv))
    if job.get("cwd"):
        os.chdir(job["cwd"])
    sys.stdout.flush()
    exit_as(supervise(argv, str(log_dir / f"launcher.node{node}.exit.json")))


if __name__ == "__main__":
    node_main(sys.argv[1])
