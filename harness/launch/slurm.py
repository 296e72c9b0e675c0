"""Cases and reference builds as Slurm jobs (`--harness-scheduler slurm`; docs/slurm.md).

Each run (a case's, or a reference build, still once per key: the reference cache's file lock
lives on the shared folder) becomes one batch job sized from its NodePlan
(harness.launch.multinode): `--nodes N --ntasks-per-node 1`, and per node `--gpus-per-node P`
on CUDA or `--cpus-per-task P` on CPU, `--time` from --harness-timeout, `--no-requeue` (a failed job is reported, never rerun
behind the harness's back), plus --harness-slurm-args. The job script runs `srun` with one task per node, each
`python -m harness.launch.slurm <logs>/job.json`, which fills in the node's part of the
command and execs it: a torchrun agent per node for the bundled trainer (c10d rendezvous on
the allocation's first node, port 20000 + job id % 10000, the case's rendezvous id), the
trainer itself for one process, a command template's command as it is. Outputs and logs go
to the run's folder in the session folder, which must be on a filesystem every node sees;
each node's output is `logs/launcher.node<i>.stdout|stderr`, merged into the run's
launcher logs as for local agents, so records, rank logs and failure diagnosis are the local
ones.

The submitting process polls `scontrol show job` and reports faults as such (ProcessResult.fault):
a job still pending past the timeout ("never started", with Slurm's reason), a job cancelled
by someone else, a node lost (NODE_FAIL), Slurm's own time limit; a run past --harness-timeout
is cancelled (scancel) and reported as timed out. On every way out, an interrupt included, a
job that has not ended is cancelled and waited for: no job is left behind.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .multinode import (
    NodePlan,
    agent_command,
    environment_without_slots,
    merge_node_logs,
    rdzv_id,
    write_nodes_record,
)
from .process import ProcessResult

POLL_S = 1.0
CANCEL_WAIT_S = 60.0
PORT_BASE = 20000
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
STARTED = {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT"}


class SlurmError(RuntimeError):
    pass


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
                   extra_args=tuple(getattr(settings, "slurm_args", ()) or ()))

    # ------------------------------------------------------------------ the job

    def job_command(self, backend, spec, plan: NodePlan) -> list[str]:
        """The command each node runs, with {head}, {port} and {node} filled in on the node."""
        if getattr(backend, "name", "") == "harness":
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
        per_node = ([f"--gpus-per-node={plan.nproc_per_node}"] if spec.device == "cuda"
                    else [f"--cpus-per-task={plan.nproc_per_node}"])
        name = re.sub(r"[^A-Za-z0-9_./-]+", "-", f"harness:{spec.case}")[:120]
        return ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={plan.nodes}",
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
        done = subprocess.run(submit, env=submit_env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or not done.stdout.strip():
            message = (done.stderr.strip() or done.stdout.strip()).splitlines()
            return self._result(spec, plan, template, None, started, False,
                                f"sbatch refused the job: {message[-1] if message else '?'} "
                                f"(command: {shlex.join(submit)})")
        job = done.stdout.strip().split(";")[0]
        self.submitted.append(job)
        (log_dir / "slurm-job").write_text(job + "\n")
        fault, timed_out, returncode = None, False, None
        ended = False
        try:
            fault, timed_out, returncode, ended = self._follow(job, started)
        finally:
            if not ended:  # an interrupt, an error, our timeout: no job is left behind
                self.cancel(job)
        return self._result(spec, plan, template, returncode, started, timed_out, fault, job)

    def _follow(self, job: str, submitted: float):
        """Wait for the job: (fault, timed_out, returncode, ended)."""
        running_since = None
        while True:
            info = self.job_info(job)
            state = info.get("JobState", "UNKNOWN")
            now = time.monotonic()
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
                job: str | None = None) -> ProcessResult:
        log_dir = spec.log_dir
        stdout, stderr = merge_node_logs(log_dir, plan.nodes, None)
        batch = log_dir / f"slurm-{job}.out"
        if batch.is_file() and batch.stat().st_size:
            with open(stderr, "ab") as out:
                out.write(f"===== the job script: {batch.name} =====\n".encode())
                out.write(batch.read_bytes())
        argvs = []
        for node in range(plan.nodes):
            try:
                argvs.append(json.loads((log_dir / f"launcher.node{node}.argv.json").read_text()))
            except (OSError, ValueError):
                argvs.append(template)
        write_nodes_record(log_dir, argvs, [returncode] * plan.nodes, None,
                           extra={"slurm_job": job})
        return ProcessResult(tuple(argvs[0]), returncode, timed_out,
                             time.monotonic() - started, stdout, stderr, fault=fault)


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


def node_main(job_file: str) -> None:
    """On each node (an srun task): fill in this node's command and exec it."""
    job = json.loads(Path(job_file).read_text())
    node = os.environ.get("SLURM_NODEID", "0")
    head = os.environ.get("HARNESS_RDZV_HOST") or "127.0.0.1"
    port = PORT_BASE + int(os.environ.get("SLURM_JOB_ID", "0")) % 10000
    argv = [a.replace("{head}", head).replace("{port}", str(port)).replace("{node}", node)
            for a in job["command"]]
    log_dir = Path(job_file).parent
    (log_dir / f"launcher.node{node}.argv.json").write_text(json.dumps(argv))
    if job.get("cwd"):
        os.chdir(job["cwd"])
    sys.stdout.flush()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    node_main(sys.argv[1])
