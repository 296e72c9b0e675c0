"""Runs made elsewhere, into the same history: the run folders InfiniTrain's own scripts write
(InfiniTensor/InfiniTrain-Test keeps them as
`infinitrain/logs/<machine>/<YYYYMMDD>/<branch>_<sha>/logs/[<tag>/]<model>_<case>.log`, older
ones `<sha>_<branch>`, newer ones with a `run_metadata.log`: docs/recorded_runs.md).

Each log is one row. Its losses come from harness.logs (the reader of recorded logs), its
tokens/s, step time and peak memory from the InfiniTrain backend's step-line parser
(harness.launch.backends.parse_step_lines, the one place InfiniTrain's step lines are read), as
InfiniTrain-Test's own history writer takes them: the mean over steps >= 2 (step 1 includes the
warm-up). The date is the metadata's `[RUN_STARTED_AT]`, else the earliest glog time of the
folder's step lines, else the date folder; branch and commit are the metadata's, else the
folder name's (harness.logs.run_folder). A row's verdict is the recorded self-check's
(harness.logs.selfcheck: each case against the folder's one-device run of its mathematics),
`passed` or `failed` with its loss margin; a case with no reference has status `ran`, a log cut
short of its last step `error` (with the reason)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from harness.launch.backends import parse_step_lines
from harness.logs.archive import judge_reading
from harness.logs.readers import BadInput, Reading, read_infinitrain, read_run_metadata
from harness.logs.selfcheck import FAILED, PASSED, Judged
from harness.logs.run_folder import branch_commit, run_date, run_root

from .rows import HistoryRow

CONFIG = "InfiniTrain run folders"  # their sessions' config, kept apart from harness sessions
UNTAGGED = "untagged"  # a flat logs/ folder (older runs) has no tag
_TOTAL = re.compile(r"\bstep\s+\d+/\s*(\d+)\s*\|")
# Logs beside the runs' that are no run: the metadata, the build's output (InfiniTrain-Test
# keeps `build_<n>.log` in the same folder), profiler reports, baseline result files.
_NOT_A_RUN = re.compile(r"^(run_metadata\.log|build_.*|.*_profile(_.*)?\.log|result_.*)$")


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return sum(values) / len(values) if values else None


def read_run_log(log: Path) -> HistoryRow | BadInput:
    """One log of a run folder as a history row, or what is wrong with it."""
    return _row(log, read_infinitrain(log))


def _row(log: Path, reading: Reading) -> HistoryRow | BadInput:
    """The history row of a log read as `reading` (harness.logs.readers.read_infinitrain)."""
    if reading.bad:
        return reading.bad[0]
    run = reading.runs[0]
    text = log.read_text(errors="replace")
    steps = parse_step_lines(text)
    root = run_root(log)
    meta = run.meta
    if not meta.get("run_metadata") and root is not None:
        candidate = root / "run_metadata.log"
        meta = {**meta, **(read_run_metadata(candidate) if candidate.is_file() else {})}
    date = run_date(meta, text, root)
    if date is None:
        return BadInput(str(log), f"{log}: no date: no [RUN_STARTED_AT] in a run_metadata.log, "
                                  "no glog time on a step line, no YYYYMMDD folder")
    folder_branch, folder_commit = branch_commit(root.name) if root is not None else (None, None)
    timed = [s for s in steps if s["step"] >= 2] or steps
    total = max((int(t) for t in _TOTAL.findall(text)), default=None)
    last = run.steps[-1]
    cut = total is not None and last < total
    machine = root.parent.parent.name if root is not None else None
    session = "/".join(p for p in (machine, root.parent.name if root else None,
                                   root.name if root else log.parent.name) if p)
    peaks = [s["peak_memory_mb"] for s in steps if s.get("peak_memory_mb") is not None]
    return HistoryRow(
        session=session, date=date, config=meta.get("config_file") or CONFIG,
        machine=machine, trainer="infinitrain", build=None,
        commit=meta.get("git_commit") or folder_commit,
        branch=meta.get("git_branch") or folder_branch,
        name=f"{run.tag or UNTAGGED}/{run.model}/{run.case}",
        status="error" if cut else "ran",
        last_loss=run.losses[-1], last_step=last,
        tokens_per_s=_mean([s["tokens_per_s"] for s in timed]),
        step_ms=_mean([s["step_time_ms"] for s in timed]),
        peak_memory_mb=max(peaks) if peaks and max(peaks) > 0 else None,
        reason=f"the log stops at step {last} of {total}" if cut else None,
        source="run-folder", origin=str(log))


def _one_date_per_run(rows: list[HistoryRow]) -> list[HistoryRow]:
    """A run folder is one night: without a [RUN_STARTED_AT] each log's date is its own first
    step's time, so every log of a folder gets the folder's earliest."""
    first: dict[str, str] = {}
    for row in rows:
        first[row.session] = min(first.get(row.session, row.date), row.date)
    return [dataclasses.replace(r, date=first[r.session]) for r in rows]


def _self_check(readings: list[Reading]) -> dict[str, Judged]:
    """The recorded self-check of the runs read (harness.logs.selfcheck: each run folder's
    cases against its one-device run), by log file."""
    runs = tuple(run for reading in readings for run in reading.runs)
    return {r.case.run.meta["file"]: r for r in judge_reading(Reading(runs, ()))
            if r.case is not None and r.status in (PASSED, FAILED)}


def _with_verdict(row: HistoryRow, judged: Judged | None) -> HistoryRow:
    """A run folder's row with its self-check verdict against the folder's one-device run:
    its status and loss margin (threshold / worst, inf where equal); a log cut short stays an
    error."""
    if judged is None or row.status == "error":
        return row
    ratio = judged.worst_ratio
    margin = math.inf if ratio == 0 else (1 / ratio if ratio is not None else None)
    status = judged.status.lower()
    return dataclasses.replace(row, status=status, self_check=status, loss_margin=margin,
                               reason=judged.line() if judged.status == FAILED else row.reason)


def read_run_folders(paths: list[Path]) -> tuple[list[HistoryRow], list[str]]:
    """Every InfiniTrain log under the paths (run folders, or any folder above them): rows, and
    one line per log that could not be read."""
    rows, notes = [], []
    for given in paths:
        given = Path(given)
        if not given.exists():
            notes.append(f"{given}: no such folder; expected an InfiniTrain run folder")
            continue
        logs = [given] if given.is_file() else sorted(
            p for p in given.rglob("*.log") if p.parent.name != "profile_logs"
            and not _NOT_A_RUN.match(p.name))
        readings = [read_infinitrain(log) for log in logs]  # each log read once, for both
        found = [_row(log, reading) for log, reading in zip(logs, readings)]
        judged = _self_check(readings)
        rows += _one_date_per_run([_with_verdict(r, judged.get(r.origin))
                                   for r in found if isinstance(r, HistoryRow)])
        notes += [b.message for b in found if isinstance(b, BadInput)]
        if not logs:
            notes.append(f"{given}: no <model>_<case>.log under it; expected an InfiniTrain "
                         "run folder")
    return rows, notes
