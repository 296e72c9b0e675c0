"""The reaper: every process a run starts is its descendant, and it ends them all.

    python -I -S harness/launch/reaper.py [--parent PID] [--exit-file F] -- ARGV...

Why a process of its own. torch 2.13's torchrun starts every rank with `start_new_session=True`,
so killing the agent's process group no longer ends the ranks: a rank whose agent was
SIGKILLed (a lost node) lives on, re-parented to init, holding its devices. The reaper sits
between the harness and the command:

- it is a child subreaper (PR_SET_CHILD_SUBREAPER, Linux >= 3.4, no privilege needed): a
  process of the run whose parent dies is re-parented to the reaper, not to init, so the
  run's processes are exactly the reaper's descendants, whatever sessions they start;
- when the command exits, whatever of the run is still alive is ended (SIGTERM, then SIGKILL
  after GRACE_S), each by pid, found by walking /proc's parent links down from the reaper;
  one stderr line names what was ended;
- SIGTERM, SIGINT or SIGHUP to the reaper (the harness's timeout or interrupt, Slurm's
  scancel) ends the command and every descendant the same way;
- it dies with its parent (PR_SET_PDEATHSIG = SIGTERM): pytest killed by SIGKILL still ends
  the run;
- its exit status is the command's: the same code, or death by the same signal, so a crash
  reads as before (`killed by signal SIGSEGV`).

A cgroup per run would also hold every descendant, but needs a delegated cgroup tree (root,
or systemd's user delegation), which neither CI containers nor most login nodes give; the
subreaper works for any user on any Linux.

`--exit-file F` writes `{"returncode": R, "ended": <unix time>}` when the command ends: the
per-node exit code of a Slurm job, as data (harness.launch.slurm).

This file and harness/launch/process.py (where ending processes is written once: SIGTERM,
SIGKILL after GRACE_S, reap) import the standard library only; run with `-I -S` it imports
process.py as a file beside its own.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time

if __package__:
    from .process import GRACE_S, descendants, end_processes
else:  # run as a file with -I -S (see above): no package, and its folder is not on sys.path
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from process import GRACE_S, descendants, end_processes  # noqa: E402

__all__ = ["GRACE_S", "descendants", "end_descendants"]  # GRACE_S, descendants: as before
CANNOT_START = 127  # the command could not be executed (a shell's code for it)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def _reap() -> bool:
    """Collect every exited child (re-parented orphans included) without blocking; True when
    this process has no child left at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def end_descendants(root: int, grace_s: float = GRACE_S) -> list[tuple[int, str]]:
    """End every descendant of `root` (process.end_processes: SIGTERM, SIGKILL what is left
    after grace_s), until none is left. Returns (pid, name) of each process that was found
    alive. `root` must be this process, or a process whose orphans come to this one (a
    subreaper), for them to be reaped."""
    names: dict[int, str] = {}

    def alive() -> list[int]:
        pids = descendants(root)
        for pid in pids:
            names.setdefault(pid, _name(pid))  # named while alive: /proc forgets it after
        return pids

    end_processes(alive, grace_s, reap=_reap)
    # Zombies re-parented to us are ours to collect, or init inherits them.
    settle = time.monotonic() + 1.0
    while root == os.getpid() and not _reap() and time.monotonic() < settle:
        time.sleep(0.01)
    return sorted(names.items())


class _Stop(Exception):
    pass


def _stop(signum, _frame):
    raise _Stop(signum)


def supervise(argv: list[str], exit_file: str | None = None) -> int:
    """Run argv as a child and end all its descendants; returns its wait status as an exit
    code (negative: killed by that signal). Must run in the process that stays the reaper."""
    become_subreaper()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _stop)
    stopped = None
    child = None
    try:
        child = os.fork()
        if child == 0:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            try:
                os.execvp(argv[0], argv)
            except OSError as error:
                print(f"reaper: cannot start {argv[0]}: {error}", file=sys.stderr, flush=True)
            os._exit(CANNOT_START)
        while True:
            pid, status = os.waitpid(-1, 0)  # re-parented orphans are collected here too
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                break
    except _Stop as stop:
        stopped = stop.args[0]
        code = -int(stopped)
    for sig in _STOP_SIGNALS:  # ending the rest cannot be interrupted half-way
        signal.signal(sig, signal.SIG_IGN)
    if exit_file:
        with open(exit_file, "w") as handle:
            json.dump({"returncode": code, "ended": time.time(), "stopped": stopped}, handle)
    ended = end_descendants(os.getpid())
    ended = [(pid, name) for pid, name in ended if pid != child or stopped is None]
    if ended:
        what = ", ".join(f"pid {pid} ({name})" for pid, name in ended)
        when = "after it was stopped" if stopped else "after the command exited"
        print(f"reaper: ended {len(ended)} process(es) of the run still alive {when}: {what}",
              file=sys.stderr, flush=True)
    return code


def exit_as(code: int) -> None:
    """Exit with a child's status: the same code, or death by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        sig = -code
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command dumped core, if any
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal is delivered before this returns; a blocked one is not
        os._exit(128 + sig)
    os._exit(code)


def main(args: list[str]) -> None:
    options: dict[str, str] = {}
    while args[:1] in (["--parent"], ["--exit-file"]) and len(args) > 1:
        options[args[0]], args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        print("usage: reaper.py [--parent PID] [--exit-file F] -- ARGV...", file=sys.stderr)
        os._exit(2)
    die_with_parent()
    if "--parent" in options and os.getppid() != int(options["--parent"]):
        os._exit(1)  # the parent died before the line above: there is nobody to run for
    exit_as(supervise(args[1:], options.get("--exit-file")))


if __name__ == "__main__":
    main(sys.argv[1:])
