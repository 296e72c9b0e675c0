"""How a rank ends, the contract between the launchers and the trainer: under torchrun and the
zygote alike, one exit code from whatever `main` did (a signal for KeyboardInterrupt, as a
plain interpreter gives), its streams flushed, then `os._exit`, without interpreter finalization.

Why not a normal exit: finalization after a gloo run can abort ("terminate called without an
active exception", SIGABRT) when the C++ worker threads of the process groups are torn down
after Python is; seen once in CI on a TP run whose three steps had all been written. Every file
the trainer writes is closed when `main` returns, so nothing is lost by skipping it. The
zygote's forked ranks must end with `os._exit` anyway (a fork's copy of the zygote must not run
its parent's exit handlers).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Callable


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
    except BaseException:
        traceback.print_exc()
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
