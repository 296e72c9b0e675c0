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
    fault = getattr(result, "fault", None)  # a lost node, a cancelled / never-started job
    if fault:
        reason = fault
    elif problem and not result.timed_out:
        reason = problem if result.returncode == 0 else f"{problem} (exit code {result.returncode})"
    elif result.timed_out:
        reason = (f"timed out after {timeout_s:g} s (--harness-timeout); "
                  f"every process of the run was killed")
    elif result.returncode is not None and result.returncode < 0:
        reason = f"killed by signal {_signal_name(-result.returncode)}"
    else:
        reason = f"exit code {result.returncode}"
    if failing is not None:
        reason = f"rank {failing} of {spec.world_size} failed first; {reason}"
    lines = [f"{case.name}: the {what} failed: {reason}",
             f"command: {shlex.join(result.argv)}",
             f"launcher log: {result.stdout}"]
    shown = False
    ranks = [failing] if failing in rank_logs else \
        (sorted(rank_logs) if result.timed_out or problem else [])
    for rank in ranks:
        per_rank = TAIL_LINES if failing is not None else 6
        for path in rank_logs[rank]:
            text = tail(path, per_rank)
            if text.strip():
                lines += [f"--- rank {rank}: {path} (last lines) ---", text]
                shown = True
    if not shown:
        for path in (result.stderr, result.stdout):
            text = tail(path, TAIL_LINES)
            if text.strip():
                lines += [f"--- {path} (last lines) ---", text]
    return "\n".join(lines)


def mismatch_text(case: Case, lines: list[str], output_dir: Path, reference_path: Path,
                  argv) -> str:
    """The loss and gradient diff lines, indented under a header, then where to look."""
    header = f"{case.name}: the run differs from the single-device reference"
    footer = [f"run folder: {output_dir}", f"reference: {reference_path}",
              f"command: {shlex.join(argv)}"]
    return "\n".join([header, *("  " + l for l in "\n".join(lines).splitlines()), *footer])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
