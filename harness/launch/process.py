"""Run one command in its own session (process group), with a timeout that ends the whole group.

torchrun and every rank it starts share the launcher's process group, so killing the group
ends a hung or half-crashed job completely; leftovers are killed after a normal exit too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

GRACE_S = 5.0


@dataclass(frozen=True)
class ProcessResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when it was killed for the timeout
    timed_out: bool
    duration_s: float
    stdout: Path
    stderr: Path
    # A launch-level fault in one line, over the exit code (a lost node, a cancelled or
    # never-started scheduler job: harness.launch.multinode / harness.launch.slurm).
    fault: str | None = None

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0


def _kill_group(pgid: int, process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; give the rest of the group a moment, then check again.
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_process(argv: Sequence[str], env: Mapping[str, str], timeout_s: float,
                stdout: Path, stderr: Path, cwd: str | os.PathLike | None = None) -> ProcessResult:
    """Run argv (a list, never a shell string); stdout / stderr go to the given files."""
    argv = tuple(str(a) for a in argv)
    stdout.parent.mkdir(parents=True, exist_ok=True)
    stderr.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=err, start_new_session=True)
        pgid = process.pid  # start_new_session: the child leads its own group
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        finally:  # every way out, KeyboardInterrupt included: never leave ranks behind
            _kill_group(pgid, process)
    return ProcessResult(argv, returncode, timed_out, time.monotonic() - started, stdout, stderr)


def tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-max_chars:]
