"""Cases that span nodes: one torchrun agent per node, joined by a c10d rendezvous.

A case of world size W is placed on `nodes = ceil(W / P)` nodes of P processes each (P:
`--harness-nproc-per-node`, default the device slots divided over `--harness-nnodes`); it is
skipped with the reason when it needs more nodes than `--harness-nnodes` or its ranks do not
split evenly over them (torchrun starts the same number of processes on every node).

Locally (the default scheduler) the "nodes" are several torchrun agents on this machine. The
case takes one all-or-nothing lease of its W slots (harness.launch.leases) and each agent gets
its own share of them (HARNESS_DEVICE_SLOTS / CUDA_VISIBLE_DEVICES), so two multi-node cases
never deadlock each holding one node. Every agent runs

    python -m torch.distributed.run --nnodes N --nproc-per-node P --rdzv-backend c10d
        --rdzv-endpoint HOST:PORT --rdzv-id <case>-<port> ... -m harness.trainer ...

with the case's own port (harness.launch.ports) and id, and its own launcher log
(`logs/launcher.node<i>.stdout|stderr`) and rank logs (`logs/ranks/node<i>/`). The c10d
rendezvous hands out node ranks in the order agents join, so which global ranks an agent ran
is read back from its log (the agent logs `global_ranks=[...]` at INFO, asked for with
LOGLEVEL=INFO) and written to `logs/nodes.json`; the rank logs are keyed by global rank as for
one node. Once every agent is done the per-node launcher logs are concatenated into the run's
`launcher.stdout` / `launcher.stderr` (the first agent to fail last, so torchrun's "Root Cause"
read from the end names the first failing rank).

Faults: when one agent fails the others get AGENT_GRACE_S to finish on their own (their ranks
see the dead peer) and are then killed with their process groups; an agent ended by a signal
is reported as a lost node (ProcessResult.fault). Each agent runs under its own reaper
(harness.launch.process), so the ranks of a lost agent, which torchrun started in sessions of
their own, are ended with it: nothing is left running on any way out.

Under Slurm (`--harness-scheduler slurm`, harness.launch.slurm) the same agent commands run
one per allocated node, with the first node of the allocation as the rendezvous host.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .process import ProcessResult, end, start
from .torchrun import node_rank_logs, torchrun_command

AGENT_GRACE_S = 15.0
_GLOBAL_RANKS = re.compile(r"group_rank=(\d+).*?global_ranks=\[([\d,\s]*)\]", re.S)


@dataclass(frozen=True)
class NodePlan:
    nodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


def nproc_per_node(settings) -> int:
    """Processes (devices) per node: the option, else the slots over the local nodes (on this
    machine) or the slots (a Slurm node is assumed to look like this one)."""
    given = settings.nproc_per_node
    if given:
        return int(given)
    if settings.scheduler == "slurm":
        return max(1, settings.slots)
    return max(1, settings.slots // settings.nnodes)


def placed(settings) -> bool:
    """Whether cases are placed on nodes (more than one, or a scheduler) rather than run as
    one local launch."""
    return settings.nnodes > 1 or settings.scheduler != "local" \
        or bool(settings.nproc_per_node)


def plan_nodes(world_size: int, settings) -> NodePlan | str:
    """The nodes a run of world_size ranks spans, or why it cannot be placed."""
    per_node, most = nproc_per_node(settings), settings.nnodes
    nodes = max(1, math.ceil(world_size / per_node))
    if nodes > most:
        return (f"{nodes} nodes of {per_node} (--harness-nproc-per-node), but --harness-nnodes "
                f"allows {most}")
    if world_size % nodes:
        return (f"{world_size} ranks do not split evenly over {nodes} nodes of at most "
                f"{per_node} (torchrun starts the same number on each)")
    return NodePlan(nodes, world_size // nodes)


def placement_problem(world_size: int, settings, foreign: bool, what: str = "it") -> str | None:
    """Why a run of world_size ranks cannot be placed under these settings, or None."""
    if settings.scheduler == "local" and world_size > settings.slots:
        return f"{what} needs {world_size} devices, but --gpus allows {settings.slots}"
    plan = plan_nodes(world_size, settings)
    if isinstance(plan, str):
        return f"{what} needs {world_size} devices: {plan}"
    if plan.nodes > 1 and foreign:
        return (f"{what} spans {plan.nodes} nodes, and only the bundled trainer is launched "
                f"across nodes (torchrun agents)")
    return None


class _NoLeases:
    """Under a scheduler the devices are the job's (Slurm allocates them): nothing to lease
    here, so the session never holds a lock while a job waits in the queue, and no device is
    named that was never leased."""

    @contextmanager
    def lease(self, count: int, timeout_s: float | None = None) -> Iterator[list[int]]:
        yield []


def case_leases(settings):
    """The device leases a CaseRunner takes: local slot locks, or none under a scheduler."""
    from .leases import DeviceLeases

    if settings.scheduler != "local":
        return _NoLeases()
    return DeviceLeases(settings.lease_dir, settings.slots)


def rdzv_id(spec) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", f"{spec.case}-{spec.port}").strip("-")[-120:]


def agent_command(backend, spec, plan: NodePlan, host: str, port: int | str, node: int | str,
                  run_id: str) -> list[str]:
    """One node's torchrun agent for the bundled trainer's run `spec`."""
    return torchrun_command(backend.trainer_args(spec), plan.nproc_per_node, f"{host}:{port}",
                            spec.log_dir / "ranks" / f"node{node}", nnodes=plan.nodes,
                            rdzv_id=run_id)


def agent_environment(backend, spec, slots: list[int]) -> dict[str, str]:
    env = backend.environment(spec)
    env["HARNESS_DEVICE_SLOTS"] = ",".join(map(str, slots))
    if spec.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
    env.setdefault("LOGLEVEL", "INFO")  # the agent's rendezvous result: its global ranks
    return env


def run_local_agents(backend, spec, plan: NodePlan, timeout_s: float,
                     host: str = "127.0.0.1") -> ProcessResult:
    """The run as plan.nodes torchrun agents on this machine, each with its share of the
    leased slots."""
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    run_id = rdzv_id(spec)
    slots = list(spec.slots) or list(range(plan.world_size))
    argvs, envs = [], []
    for node in range(plan.nodes):
        argvs.append(agent_command(backend, spec, plan, host, spec.port, node, run_id))
        share = slots[node * plan.nproc_per_node:(node + 1) * plan.nproc_per_node]
        envs.append(agent_environment(backend, spec, share))
    return run_agents(argvs, envs, timeout_s, spec.log_dir)


def run_agents(argvs: list[list[str]], envs: list[dict], timeout_s: float, log_dir: Path,
               grace_s: float = AGENT_GRACE_S) -> ProcessResult:
    """Start every agent in its own process group; wait for all, up to timeout_s. The first
    failure gives the rest grace_s, then they are killed; every group is killed on the way
    out."""
    started = time.monotonic()
    procs: list[subprocess.Popen] = []
    files = []
    ended: dict[int, float] = {}
    first_failure: int | None = None
    timed_out = False
    try:
        for node, (argv, env) in enumerate(zip(argvs, envs)):
            out = open(log_dir / f"launcher.node{node}.stdout", "wb")
            err = open(log_dir / f"launcher.node{node}.stderr", "wb")
            files += [out, err]
            procs.append(start(argv, env, out, err))
        deadline = started + timeout_s
        grace_end = None
        while len(ended) < len(procs):
            now = time.monotonic()
            for node, proc in enumerate(procs):
                if node not in ended and proc.poll() is not None:
                    ended[node] = now
                    if proc.returncode != 0 and first_failure is None:
                        first_failure = node
                        grace_end = now + grace_s
            if len(ended) == len(procs):
                break
            if now > deadline:
                timed_out = first_failure is None
                break
            if grace_end is not None and now > grace_end:
                break
            time.sleep(0.1)
    finally:
        for proc in procs:
            end(proc)
        for handle in files:
            handle.close()
    codes = [proc.returncode for proc in procs]
    fault = None
    if first_failure is not None:
        code = codes[first_failure]
        returncode = code
        if code is not None and code < 0:
            fault = (f"node {first_failure} lost: its torchrun agent was killed by "
                     f"{_signal_name(-code)}; the other agents were stopped")
    elif timed_out:
        returncode = None
    else:
        returncode = 0
    stdout, stderr = merge_node_logs(log_dir, len(procs), first_failure)
    write_nodes_record(log_dir, argvs, codes, first_failure)
    return ProcessResult(tuple(str(a) for a in argvs[0]), returncode, timed_out,
                         time.monotonic() - started, stdout, stderr, fault=fault)


def merge_node_logs(log_dir: Path, nodes: int, first_failure: int | None,
                    stem: str = "launcher.node{node}") -> tuple[Path, Path]:
    """launcher.stdout / launcher.stderr: every node's, under a banner; the first failing node
    last."""
    order = [n for n in range(nodes) if n != first_failure]
    if first_failure is not None:
        order.append(first_failure)
    merged = []
    for kind in ("stdout", "stderr"):
        target = log_dir / f"launcher.{kind}"
        with open(target, "wb") as out:
            for node in order:
                path = log_dir / f"{stem.format(node=node)}.{kind}"
                out.write(f"===== node {node}: {path.name} =====\n".encode())
                try:
                    out.write(path.read_bytes())
                except OSError:
                    out.write(b"(missing)\n")
        merged.append(target)
    return merged[0], merged[1]


def write_nodes_record(log_dir: Path, argvs, codes, first_failure, stem: str = "launcher.node{node}",
                       extra: dict | None = None) -> dict:
    """logs/nodes.json: each node's command, exit code and global ranks."""
    nodes = []
    for node, (argv, code) in enumerate(zip(argvs, codes)):
        ranks = global_ranks(log_dir / f"{stem.format(node=node)}.stderr")
        nodes.append({"node": node, "command": [str(a) for a in argv], "returncode": code,
                      "global_ranks": ranks})
    record = {"nodes": nodes, "first_failure": first_failure, **(extra or {})}
    (log_dir / "nodes.json").write_text(json.dumps(record, indent=1))
    return record


def global_ranks(agent_log: Path) -> list[int] | None:
    """The global ranks an agent ran, in local-rank order, from its INFO rendezvous line."""
    try:
        text = agent_log.read_text(errors="replace")
    except OSError:
        return None
    found = _GLOBAL_RANKS.findall(text)
    if not found:
        return None
    return [int(r) for r in found[-1][1].split(",") if r.strip()]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def environment_without_slots(env: dict[str, str]) -> dict[str, str]:
    """An environment for a scheduler's job: the device selection is the job's, not ours."""
    return {k: v for k, v in env.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "HARNESS_DEVICE_SLOTS")}


__all__ = ["NodePlan", "agent_command", "case_leases", "node_rank_logs",
           "placement_problem", "plan_nodes", "placed", "run_agents"]
