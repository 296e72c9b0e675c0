"""`python -m harness.trainer`: run, then end the process the way the zygote ends its ranks.

Interpreter finalization after a gloo run can abort ("terminate called without an active
exception", SIGABRT) when C++ worker threads of the process groups are torn down after Python
is: seen once in CI on a TP run whose three steps had all been written. Every file the trainer
writes is closed when `main` returns, so nothing is lost by skipping finalization. The zygote's
ranks (forked children) end with os._exit too, so both launchers now end a rank alike.
"""
import os
import sys

from harness.trainer.main import main

try:
    code = main()
except SystemExit as stop:  # argparse (its message is printed) or a message to print
    if stop.code is None or isinstance(stop.code, int):
        code = stop.code or 0
    else:
        print(stop.code, file=sys.stderr)
        code = 1
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
