"""torchrun: its command line for the bundled trainer, built in one place (one agent on this
machine, or one agent per node: harness.launch.multinode), and the launcher that runs it
(TorchrunLauncher, the Launcher protocol of harness.launch.launcher) with its log layout and its
failure record."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..contracts.rank_exit import RANK_FAILURES_DIR, first_failed_rank
from .launcher import RankRun, rank_with_traceback
from .process import ProcessResult, run_process


def torchrun_command(trainer_args: Sequence[str], nproc_per_node: int, endpoint: str,
                     log_dir: Path, nnodes: int | None = None,
                     rdzv_id: str | None = None, module: str = "harness.trainer") -> list[str]:
    """`python -m torch.distributed.run ... -m harness.trainer ARGS`: a c10d rendezvous at
    `endpoint` (HOST:PORT), no restarts, each rank's output under log_dir (torchrun's
    `attempt_0/<rank>/` layout, shown live too)."""
    nodes = ["--nnodes", str(nnodes)] if nnodes is not None else []
    run_id = ["--rdzv-id", rdzv_id] if rdzv_id is not None else []
    return [
        sys.executable, "-m", "torch.distributed.run", *nodes,
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, *run_id,
        "--max-restarts", "0",
        "--log-dir", str(log_dir), "--redirects", "3", "--tee", "3",
        "-m", module, *map(str, trainer_args),
    ]


class TorchrunLauncher:
    """One torchrun agent on this machine (`python -m module` alone for one process). Its logs:
    `<log_dir>/ranks/<run id>/attempt_0/<rank>/{stdout,stderr}.log`, or one folder per node
    (`ranks/node<i>/`, harness.launch.multinode). Its failure record: the "Root Cause" block of
    its ChildFailedError text, corrected by each rank's own record (harness.contracts.rank_exit)."""

    name = "torchrun"

    def command(self, run: RankRun) -> list[str]:
        if run.world_size == 1:
            return run.one_process()
        return torchrun_command(run.args, run.world_size, f"127.0.0.1:{run.port}",
                                run.log_dir / "ranks", module=run.module)

    def launch(self, run: RankRun) -> ProcessResult:
        result = run_process(self.command(run), run.env, run.timeout_s, run.stdout, run.stderr,
                             cwd=run.cwd)
        return replace(result, launcher=self.name)

    def rank_logs(self, log_dir: Path, result: ProcessResult) -> dict[str, list[Path]]:
        if (log_dir / "ranks" / "node0").is_dir():  # one torchrun agent per node
            return node_rank_logs(log_dir)
        logs: dict[str, list[Path]] = {}
        for path in sorted((log_dir / "ranks").glob("**/attempt_*/*/*.log")):
            logs.setdefault(path.parent.name, []).append(path)
        return logs

    def failing_rank(self, log_dir: Path, result: ProcessResult) -> str | None:
        records = log_dir / RANK_FAILURES_DIR  # each rank's own record of its exception
        try:  # torchrun's agent says it only in its ChildFailedError text
            text = result.stderr.read_text(errors="replace") + \
                result.stdout.read_text(errors="replace")
        except OSError:
            first = first_failed_rank(records)
            return None if first is None else str(first)
        root = text.rfind("Root Cause")
        match = re.search(r"rank\s*:\s*(\d+)", text[root:]) if root >= 0 else None
        # the records correct torchrun's whole-second tie-break between ranks that raised
        first = first_failed_rank(records, int(match.group(1)) if match else None)
        if first is not None:
            return str(first)
        return rank_with_traceback(self.rank_logs(log_dir, result))


def node_rank_logs(log_dir: Path) -> dict[str, list[Path]]:
    """Each global rank's log files under logs/ranks/node<i>/, keyed as on one node (which
    global ranks an agent ran: logs/nodes.json, harness.launch.multinode)."""
    try:
        record = json.loads((log_dir / "nodes.json").read_text())
    except (OSError, ValueError):
        record = {"nodes": []}
    ranks_of = {n["node"]: n.get("global_ranks") for n in record.get("nodes", [])}
    per_node = None
    logs: dict[str, list[Path]] = {}
    for node_dir in sorted((log_dir / "ranks").glob("node*")):
        try:
            node = int(node_dir.name[4:])
        except ValueError:
            continue
        for path in sorted(node_dir.glob("**/attempt_*/*/*.log")):
            local = int(path.parent.name)
            mapping = ranks_of.get(node)
            if mapping and local < len(mapping):
                rank = mapping[local]
            else:  # unknown assignment: node-major, as a static rendezvous would give
                if per_node is None:
                    per_node = max(1, len({p.parent.name for p in node_dir.glob("**/attempt_*/*/*.log")}))
                rank = node * per_node + local
            logs.setdefault(str(rank), []).append(path)
    return logs
