"""The failure text pytest shows for a case: a crashed, killed or hung run (the command, the
failing rank and its log tail), or a run that differs from its reference."""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

from harness.cases import Case
from harness.launch import LaunchSpec, ProcessResult, tail

TAIL_LINES = 25


def crash_text(case: Case, spec: LaunchSpec, result: ProcessResult, failing: str | None,
               rank_logs: dict, timeout_s: float, what: str = "run",
               problem: str | None = None) -> str:
    if result.fault:  # a lost node, a cancelled / never-started job
        reason = result.fault
    elif problem and not result.timed_out:
        reason = problem if result.returncode == 0 else f"{problem} ({exit_text(result.returncode)})"
    elif result.timed_out:
        reason = (f"timed out after {timeout_s:g} s (--harness-timeout); "
                  f"every process of the run was killed")
    else:
        reason = exit_text(result.returncode)
    if failing is not None:
        reason = f"rank {failing} of {spec.world_size} failed first; {reason}"
    lines = [f"{case.name}: the {what} failed: {reason}",
             f"command: {shlex.join(result.argv)}",
             f"launcher log: {result.stdout}"]
    # The failing rank's log; every rank's (a few lines each) for a hang or a problem no rank
    # owns; the launcher's own output where no rank log has anything.
    ranks = [failing] if failing in rank_logs else \
        (sorted(rank_logs) if result.timed_out or problem else [])
    per_rank = TAIL_LINES if failing is not None else 6
    shown = [[f"--- rank {rank}: {path} (last lines) ---", text]
             for rank in ranks for path in rank_logs[rank]
             for text in [tail(path, per_rank)] if text.strip()]
    if not shown:
        shown = [[f"--- {path} (last lines) ---", text]
                 for path in (result.stderr, result.stdout)
                 for text in [tail(path, TAIL_LINES)] if text.strip()]
    return "\n".join(lines + [line for section in shown for line in section])


SELF_CHECK = "the single-device reference"


def mismatch_text(case: Case, lines: list[str], output_dir: Path, reference_path: Path,
                  argv, against: tuple[str, ...] = (SELF_CHECK,)) -> str:
    """The loss and gradient diff lines, indented under a header naming what the run differs
    from (its own single-device reference, a baseline, or both), then where to look."""
    header = f"{case.name}: the run differs from {' and from '.join(against)}"
    footer = [f"run folder: {output_dir}", f"reference: {reference_path}",
              f"command: {shlex.join(argv)}"]
    return "\n".join([header, *("  " + l for l in "\n".join(lines).splitlines()), *footer])


# Signals a crashing native trainer dies of; a shell that ran it reports 128 + N.
_CRASH_SIGNALS = (signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL,
                  signal.SIGSEGV)


def exit_text(returncode: int | None) -> str:
    """`exit code 1`; for a process a signal ended, the signal by name: `killed by signal
    SIGSEGV (exit code -11)`, or `killed by signal SIGABRT (exit code 134 = 128 + 6, as a
    shell reports it)`."""
    if returncode is not None and returncode < 0:
        return f"killed by signal {_signal_name(-returncode)} (exit code {returncode})"
    if returncode is not None and returncode - 128 in _CRASH_SIGNALS:
        number = returncode - 128
        return (f"killed by signal {_signal_name(number)} (exit code {returncode} = 128 + "
                f"{number}, as a shell reports it)")
    return f"exit code {returncode}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
