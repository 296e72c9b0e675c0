"""Stand-in for InfiniTrain's ``tools/infini_run``: ``python -m tests.infinitrain_standin.infini_run
[--nnodes N] [--nproc_per_node N] [--node_rank R] [--rdzv_endpoint host:port] -- PROGRAM ARGS...``

gflags parsing (so, as the real one, the trainer's own flags must follow a ``--``; without it
gflags takes them as the launcher's and fails on the first unknown one). Forks nproc_per_node
children with NNODES, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT, GLOBAL_PROC_RANK, LOCAL_PROC_RANK,
PROC_WORLD_SIZE set, execs PROGRAM in each (execvp: PATH lookup, or a path), waits for all of
them and exits 0 whatever they did."""

from __future__ import annotations

import os
import sys

from . import gflags
from .gflags import Flag
from .glog import Logger

_F = "tools/infini_run/infini_run.cc"  # DEFINE_* at infini_run.cc:11-14
FLAGS = gflags.with_gflags_flags({f.name: f for f in [
    Flag("nnodes", "int32", 1, None, "Total number of nodes", _F),
    Flag("nproc_per_node", "int32", 1, None, "Number of processes per node", _F),
    Flag("node_rank", "int32", 0, None, "Rank of this node", _F),
    Flag("rdzv_endpoint", "string", "127.0.0.1:29500", None, "Rendezvous endpoint (host:port)", _F)]})


def main(argv: list[str]) -> None:
    fl, rest = gflags.parse_or_exit(argv, FLAGS, "infini_run")
    log = Logger("infini_run", fl)
    if len(rest) < 1:
        log.check_op(False, "argc >= 2", len(rest) + 1, 2, "No training prgram specified!", "infini_run.cc:20")
    program = rest[0]
    world = fl["nnodes"] * fl["nproc_per_node"]
    ep = fl["rdzv_endpoint"]
    addr, port = ep.split(":", 1) if ":" in ep else (ep, ep)
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for local in range(fl["nproc_per_node"]):
        pid = os.fork()
        if pid == 0:
            try:
                env = os.environ
                env["NNODES"] = str(fl["nnodes"])
                env["NPROC_PER_NODE"] = str(fl["nproc_per_node"])
                env["MASTER_ADDR"], env["MASTER_PORT"] = addr, port
                env["GLOBAL_PROC_RANK"] = str(fl["node_rank"] * fl["nproc_per_node"] + local)
                env["LOCAL_PROC_RANK"] = str(local)
                env["PROC_WORLD_SIZE"] = str(world)
                os.execvp(program, rest)
            except OSError as e:
                sys.stderr.write(f"exec failed: {e.strerror}\n")
                sys.stderr.flush()
            os._exit(1)
        pids.append(pid)
    for _ in pids:
        try:
            os.wait()
        except ChildProcessError:
            break
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
