"""Starting and ending the processes of a run: the one place that does either.

Every launched command runs under the reaper (harness.launch.reaper): a child subreaper in a
session of its own, whose descendants are exactly the run's processes, whatever sessions they
start (torch 2.13's torchrun starts each rank in a new one). Ending a run is one signal to the
reaper, which ends every descendant by pid; the reaper's group is killed as well, in case the
reaper itself was killed. The reaper dies with its parent, so even pytest killed by SIGKILL
leaves nothing behind.

Ending processes (SIGTERM, wait up to GRACE_S, SIGKILL, reap) is written once, here:
`end_processes`, over the pids a caller names. The reaper ends its descendants with it, the
zygote's leader its remaining ranks, and `end_group` a process group. This module imports the
standard library only, so the reaper (`python -I -S reaper.py`, no package) imports it as a
file beside its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

GRACE_S = 5.0  # SIGTERM to SIGKILL, as torchrun's agent gives its workers
REAPER = Path(__file__).with_name("reaper.py")


@dataclass(frozen=True)
class SchedulerJob:
    """A run that was a scheduler's job (harness.launch.slurm)."""
    scheduler: str
    job_id: str | None
    nodes: int
    node_list: str | None  # the scheduler's name for the nodes it ran on
    queue_s: float | None  # submitted -> started; None when it never started
    run_s: float | None  # started -> ended


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
    job: SchedulerJob | None = None
    # The launcher that started the ranks (harness.launch.launcher): whose log layout and
    # failure record the run has. None: a command that launched its own processes.
    launcher: str | None = None

    @property
    def ok(self) -> bool:
        # A fault is never a good run, whatever the exit code: a job cancelled while still
        # pending ends with exit code 0.
        return not self.timed_out and self.returncode == 0 and self.fault is None

    @property
    def run_s(self) -> float:
        """The run alone: a scheduler job's time in the queue left out."""
        if self.job is not None and self.job.run_s is not None:
            return self.job.run_s
        return self.duration_s


def reaped(argv: Sequence[str], exit_file: Path | None = None) -> list[str]:
    """argv run under the reaper, for this process as its parent."""
    extra = ["--exit-file", str(exit_file)] if exit_file else []
    return [sys.executable, "-I", "-S", str(REAPER), "--parent", str(os.getpid()), *extra, "--",
            *map(str, argv)]


def start(argv: Sequence[str], env: Mapping[str, str], stdout, stderr, stdin=subprocess.DEVNULL,
          cwd: str | os.PathLike | None = None, exit_file: Path | None = None) -> subprocess.Popen:
    """argv under a reaper of its own, in a new session; end it with `end`."""
    return subprocess.Popen(reaped(argv, exit_file), env=dict(env), cwd=cwd, stdin=stdin,
                            stdout=stdout, stderr=stderr, start_new_session=True)


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to the process group (0: only ask whether it is there); False when the group
    is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _live_processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process, from /proc; zombies are left
    out (already dead, only waiting to be reaped)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            found[int(entry)] = (int(fields[1]), int(fields[2]))
    return found


def descendants(root: int) -> list[int]:
    """Every live process below `root`, by /proc parent links (parents before children)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _group) in _live_processes().items():
        children.setdefault(parent, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            found.append(child)
            frontier.append(child)
    return found


def group_members(pgid: int) -> list[int]:
    """Every live process of the process group pgid."""
    return sorted(pid for pid, (_parent, group) in _live_processes().items() if group == pgid)


def end_processes(alive: Callable[[], Collection[int]], grace_s: float = GRACE_S,
                  reap: Callable[[], object] | None = None) -> list[int]:
    """End processes, the one way this package does: SIGTERM each, wait up to grace_s for all
    to go, then SIGKILL what is left and wait up to grace_s again. Returns every pid seen, in
    the order first seen.

    `alive()` names the live processes to end; it is asked again between looks, so one started
    meanwhile (a rank forked after the first look) is signalled too, and the wait ends as soon
    as it names none. Each pid gets each signal once: a second SIGTERM would interrupt the
    clean-up a first one started (torchrun's agent stopping its workers). `reap()`, when the
    caller is the processes' parent or subreaper, collects the exited ones between looks; a
    caller that waits for them itself (the zygote's leader, which records each rank's exit code)
    passes none."""
    seen: dict[int, None] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signalled: set[int] = set()
        deadline = time.monotonic() + grace_s
        while True:
            pids = alive()
            if not pids:
                return list(seen)
            for pid in pids:
                seen.setdefault(pid, None)
                if pid not in signalled:
                    signalled.add(pid)
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            if reap is not None:
                reap()
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    return list(seen)


def end_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """End every process of the group (end_processes over its live members)."""
    end_processes(lambda: group_members(pgid), grace_s)


def end(process: subprocess.Popen, grace_s: float = GRACE_S) -> int | None:
    """End a process `start` began, with every process of its run; returns its exit code.

    SIGTERM to the reaper ends its whole tree (SIGTERM, SIGKILL after grace_s); past twice
    grace_s the reaper's own group is killed too. Safe to call on a finished process."""
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=2 * grace_s + 1)
        except subprocess.TimeoutExpired:
            pass
    signal_group(process.pid, signal.SIGKILL)  # the reaper's session: nothing of it may stay
    return process.wait()


def run_process(argv: Sequence[str], env: Mapping[str, str], timeout_s: float,
                stdout: Path, stderr: Path, cwd: str | os.PathLike | None = None) -> ProcessResult:
    """Run argv (a list, never a shell string); stdout / stderr go to the given files."""
    argv = tuple(str(a) for a in argv)
    stdout.parent.mkdir(parents=True, exist_ok=True)
    stderr.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = start(argv, env, out, err, cwd=cwd)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        finally:  # every way out, KeyboardInterrupt included: never leave ranks behind
            end(process)
    return ProcessResult(argv, returncode, timed_out, time.monotonic() - started, stdout, stderr)


def tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-max_chars:]
