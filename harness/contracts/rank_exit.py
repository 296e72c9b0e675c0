"""How a rank ends, the contract between the launchers and the trainer: under torchrun and the
zygote alike, one exit code from whatever `main` did (a signal for KeyboardInterrupt, as a
plain interpreter gives), its streams flushed, then `os._exit`, without interpreter finalization.

Why not a normal exit: finalization after a gloo run can abort ("terminate called without an
active exception", SIGABRT) when the C++ worker threads of the process groups are torn down
after Python is; seen once in CI on a TP run whose three steps had all been written. Every file
the trainer writes is closed when `main` returns, so nothing is lost by skipping it. The
zygote's forked ranks must end with `os._exit` anyway (a fork's copy of the zygote must not run
its parent's exit handlers).

Which rank failed first is written as data, not left to a launcher's log: a rank whose `main`
raises writes `rank<R>.json` (its RANK, the time the exception reached it, its last line) into
$HARNESS_RANK_FAILURES when the launcher sets it. torchrun names the "first observed failure"
by whole-second timestamps with ties to the lowest rank, so when a crash on rank 1 makes rank 0
fail a few milliseconds later ("Connection closed by peer"), it named rank 0: seen once ranks
stopped skipping finalization's delay. A rank killed by a signal writes nothing: where the
launcher names such a rank, its word stands.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from .records import write_atomic

FAILURES_ENV = "HARNESS_RANK_FAILURES"
RANK_FAILURES_DIR = "rank_failures"  # the launcher's choice: under a case's log folder


def exit_code(main: Callable[[], int | None]) -> int:
    """Run `main`; its exit code: its return value, SystemExit's code (a message instead of a
    code is printed and gives 1, as Python does), 1 after any other exception (its traceback
    printed). A code outside 0..255 is 1. On KeyboardInterrupt the process ends at once by
    SIGINT, as an interpreter does, so that the launcher sees the signal."""
    try:
        code = main()
    except SystemExit as stop:  # argparse (its message already printed) or a message to print
        code = stop.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130  # not reached: SIGINT's default action ends the process
    except BaseException as error:
        failed_at = time.time()
        traceback.print_exc()
        _record_failure(failed_at, error)
        code = 1
    _flush()
    code = code or 0
    return code if isinstance(code, int) and 0 <= code < 256 else 1


def end(main: Callable[[], int | None]) -> None:
    """Run `main` and end the process with its exit code (exit_code), skipping finalization."""
    os._exit(exit_code(main))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more to save
            pass


def _record_failure(failed_at: float, error: BaseException) -> None:
    folder = os.environ.get(FAILURES_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(folder) / f"rank{rank}.json", json.dumps({
            "rank": int(rank), "time": failed_at,
            "error": f"{type(error).__name__}: {error}"[:500]}))
    except (OSError, ValueError):  # the record is a help; the exit code is what must happen
        pass


def first_failed_rank(folder: Path, named: int | None = None) -> int | None:
    """The rank whose exception came first, from the records in `folder`. `named` is the rank
    the launcher names: it stands when it left no record (a rank killed by a signal cannot time
    its own death), and when there is no record at all."""
    found = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        try:
            data = json.loads(path.read_text())
            found[int(data["rank"])] = float(data["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not found or (named is not None and named not in found):
        return named
    return min(found, key=lambda rank: (found[rank], rank))
