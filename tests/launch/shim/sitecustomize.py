"""Faults planted in the real trainer for the launcher tests (on PYTHONPATH, so torchrun's ranks
and the zygote load it alike). The case id (the end of HARNESS_CASE) says which, as with the
fake trainer (tests/plugin/fake_trainer.py); rank 1 misbehaves:

    crash    raises RuntimeError("planted crash on rank 1")
    hang     starts a child process, then sleeps            sigkill  SIGKILLs itself
    slow     sleeps 2 s before training (the zygote-death test kills the zygote meanwhile)

Every rank appends {case, pid, rank, port} (and a hang's child) to $FAULT_RECORD_DIR/pids.jsonl.
Rank 1 faults only once rank 0 of its run (the same MASTER_PORT) has recorded itself: else a
fault at once could have rank 0 killed before it recorded, and a test checking that no rank is
left would not know rank 0's pid.
"""

import json
import os


def _record(entry):
    folder = os.environ.get("FAULT_RECORD_DIR")
    if folder:
        with open(os.path.join(folder, "pids.jsonl"), "a") as stream:
            stream.write(json.dumps(entry) + "\n")


def _wait_for_rank_0(port, timeout_s=60.0):
    import time

    path = os.path.join(os.environ.get("FAULT_RECORD_DIR", ""), "pids.jsonl")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as stream:
                entries = [json.loads(line) for line in stream if line.strip()]
            if any(e["rank"] == 0 and e.get("port") == port for e in entries):
                return
        time.sleep(0.02)


def _plant():
    try:
        import harness.trainer.main as trainer_main
    except Exception:  # not the harness's interpreter: nothing to plant
        return
    original = trainer_main._train

    def _train(*args, **kwargs):
        import signal
        import subprocess
        import sys
        import time

        case = os.environ.get("HARNESS_CASE", "")
        mode = case.rsplit("/", 1)[-1]
        rank = int(os.environ.get("RANK", "0"))
        port = os.environ.get("MASTER_PORT")
        _record({"case": case, "pid": os.getpid(), "rank": rank, "port": port})
        if rank == 1 and case != "reference":
            if mode in ("crash", "hang", "sigkill"):
                _wait_for_rank_0(port)
            if mode == "crash":
                raise RuntimeError("planted crash on rank 1")
            if mode == "hang":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                _record({"case": case, "pid": child.pid, "rank": rank, "child": True})
                time.sleep(600)
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "slow":
                time.sleep(2)
        return original(*args, **kwargs)

    trainer_main._train = _train


_plant()
