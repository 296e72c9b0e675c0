"""Faults planted in the real trainer for the launcher tests (on PYTHONPATH, so torchrun's ranks
and the zygote load it alike). The case id (the end of HARNESS_CASE) says which, as with the
fake trainer (tests/plugin/fake_trainer.py); rank 1 misbehaves:

    crash    raises RuntimeError("planted crash on rank 1")
    hang     starts a child process, then sleeps            sigkill  SIGKILLs itself
    slow     sleeps 2 s before training (the zygote-death test kills the zygote meanwhile)

Every rank appends {case, pid, rank} (and a hang's child) to $FAULT_RECORD_DIR/pids.jsonl.
"""

import json
import os


def _record(entry):
    folder = os.environ.get("FAULT_RECORD_DIR")
    if folder:
        with open(os.path.join(folder, "pids.jsonl"), "a") as stream:
            stream.write(json.dumps(entry) + "\n")


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
        _record({"case": case, "pid": os.getpid(), "rank": rank})
        if rank == 1 and case != "reference":
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
