"""A tree of run folders judged night by night: each folder on its own (harness.logs.selfcheck),
then the same case followed across machines, nights and commits.

What it says of a case (`tag/model/id` and its dtype): on which machines and commits it failed,
the first and last night of each verdict, every change of verdict between two nights of one
machine with both commits, and where the same commit on two machines (a cross-hardware pair)
gave different verdicts. Its records (`findings.jsonl`, docs/results_format.md) hold one
judged (run folder, case) each; `report.md` the lines, a cases x nights grid (each cell the
worst |diff| over the limit it was judged by), and the findings. No torch here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from harness.contracts.flags import NO_DECLARED_ROLES, DeclaredRoles

from .readers import BadInput, Reading, RecordedRun
from .run_folder import RunPlace, run_root
from .selfcheck import (
    BAD,
    FAILED,
    NO_REFERENCE,
    NOT_JUDGED,
    PASSED,
    REFERENCE,
    STATUSES,
    Judged,
    RecordedCase,
    judge_folder,
    recorded_case,
    worst_text,
)

FINDINGS_FORMAT = "harness.recorded_selfcheck/1"
JUDGED = (PASSED, FAILED)  # the statuses a case's verdict has


def judge_reading(reading: Reading, declared: DeclaredRoles = NO_DECLARED_ROLES,
                  config_args: dict | None = None) -> list[Judged]:
    """Every InfiniTrain run of a reading, run folder by run folder, judged; its bad inputs
    beside (each in the folder it came from where that is known)."""
    by_folder: dict[str, list] = {}
    rows: list[Judged] = []
    for run in reading.runs:
        if run.kind == "harness":
            rows.append(session_verdict(run))
        if run.kind != "infinitrain":
            continue
        case = recorded_case(run, declared, config_args)
        key = str(case.place.root) if not isinstance(case, BadInput) else _folder_of(case)
        by_folder.setdefault(key, []).append(case)
    for bad in reading.bad:
        by_folder.setdefault(_folder_of(bad), []).append(bad)
    for key in sorted(by_folder):
        rows += judge_folder(by_folder[key])
    return rows


# A harness session's record status, as this tool's statuses.
_SESSION_STATUS = {"passed": PASSED, "failed": FAILED}


def session_verdict(run: RecordedRun) -> Judged:
    """A harness session's case: judged already, live, against the reference run the session
    ran (its record's status), not again."""
    folder = Path(run.meta["file"]).parent
    place = RunPlace(folder, None, None, None, None, str(folder))
    status = run.meta.get("status")
    judged = _SESSION_STATUS.get(status, NOT_JUDGED)
    why = (f"{run.source}: the session's own verdict, against the one-device reference it ran"
           if judged != NOT_JUDGED else
           f"{run.source}: status {status!r} in the session's record; no verdict to report")
    return Judged(RecordedCase(run, place, run.model), judged, why, place=place)


def _folder_of(bad: BadInput) -> str:
    path = Path(bad.source.split(" [")[0])
    root = run_root(path)
    return str(root if root is not None else path.parent)


def empty_run_folders(paths: Sequence[str], rows: Sequence[Judged]) -> list[Judged]:
    """A BAD INPUT row for every run folder (a `logs/` folder) under the paths that gave no
    row: no log the harness can read there."""
    seen = {str(r.place.root) for r in rows if r.place is not None}
    seen |= {_folder_of(r.bad) for r in rows if r.bad is not None}
    out = []
    for given in paths:
        for folder, subfolders, files in os.walk(given):
            if Path(folder).name != "logs" or not _holds_logs(Path(folder), files):
                continue
            subfolders.clear()  # what is inside a run's logs/ folder is that run's
            root = Path(folder).parent
            if str(root) not in seen:
                bad = BadInput(str(root), f"{folder}: no log the harness can read; expected "
                                          "<model>_<case>.log files with `step N/M | train "
                                          "loss X` lines")
                out.append(Judged(None, BAD, bad.message, bad=bad))
    return out


def _holds_logs(folder: Path, files: list[str]) -> bool:
    """Whether a `logs/` folder is a run's: `.log` files in it or in its tag folders (the
    archive's own `infinitrain/logs/` holds machines; a baseline's `logs/<machine>/` its
    `result_*.log`)."""
    def run_log(name: str) -> bool:
        return name.endswith(".log") and not name.startswith("result_")

    if any(run_log(f) for f in files):
        return True
    return any(run_log(p.name) for sub in folder.iterdir() if sub.is_dir()
               for p in sub.iterdir())


# ----------------------------------------------------------------------- the records


def finding(row: Judged) -> dict:
    """One judged (run folder, case) as a JSON record (docs/results_format.md)."""
    case, place, v = row.case, row.place, row.verdict
    ref = row.reference if row.status in JUDGED or row.status == BAD else None
    worst = None
    if v is not None and not v.problem and v.steps:
        worst = {"step": v.worst_step, "abs_diff": _clean(v.max_abs_diff),
                 "ratio": _clean(row.worst_ratio)}
    source = case.run.source if case is not None else (row.bad.source if row.bad else None)
    return {
        "format": FINDINGS_FORMAT,
        "machine": place.machine if place else None,
        "date": place.night if place else None,
        "branch": place.branch if place else None,
        "commit": place.commit if place else None,
        "run_folder": place.label if place else None,
        "case": row.label,
        "dtype": row.dtype,
        "flags": dict(case.args) if case is not None and case.args is not None else None,
        "flags_from": case.flags_from if case is not None else None,
        "topology": case.topology.text() if case is not None and case.topology else None,
        "reference": ({"case": ref.label, "one_device": row.one_device,
                       "topology": ref.topology.text(), "source": ref.run.source}
                      if ref is not None and ref is not case else None),
        "status": row.status,
        "first_diverging_step": v.first_diverging_step if v is not None else None,
        "worst": worst,
        "threshold": v.threshold if v is not None else None,
        "topology_difference": row.topology_difference if ref is not None else None,
        "missing_steps": list(row.missing_steps),
        "why": row.why or None,
        "notes": list(row.notes),
        "line": row.line(),
        "source": source,
    }


def _clean(x):
    return None if x is None or not math.isfinite(x) else x


def write_findings(rows: Sequence[Judged], path: Path) -> None:
    path.write_text("".join(json.dumps(finding(r), sort_keys=True) + "\n" for r in rows))


# ------------------------------------------------------------------- across nights


@dataclass(frozen=True)
class Night:
    """One case on one machine and night: its verdict there."""

    machine: str
    night: str
    branch: str
    commit: str
    status: str
    ratio: float | None
    first_diverging_step: int | None

    @property
    def build(self) -> str:
        return f"{self.branch}@{self.commit[:7]}" if self.commit else self.branch


def _nights(rows: Iterable[Judged]) -> dict[tuple[str, str], list[Night]]:
    """(case, dtype) -> its judged nights, in order of night, machine and commit."""
    out: dict[tuple[str, str], list[Night]] = {}
    for row in rows:
        if row.status not in JUDGED or row.place is None:
            continue
        p = row.place
        v = row.verdict
        out.setdefault((row.label, row.dtype), []).append(Night(
            p.machine or str(p.root), p.night or "?", p.branch or "?", p.commit or "",
            row.status, row.worst_ratio, v.first_diverging_step if v else None))
    for nights in out.values():
        nights.sort(key=lambda n: (n.night, n.machine, n.commit))
    return out


def case_findings(rows: Sequence[Judged]) -> list[str]:
    """What the archive says of each case judged on more than one night or machine, and of
    each case that failed: one paragraph (a line each) per case."""
    out = []
    for (label, dtype), nights in sorted(_nights(rows).items()):
        failed = [n for n in nights if n.status == FAILED]
        if len(nights) < 2 and not failed:
            continue
        said = [f"{label} {dtype}: judged on {len(nights)} night(s) of "
                f"{len({n.machine for n in nights})} machine(s)"]
        if failed:
            said.append(f"failed on {', '.join(sorted({n.machine for n in failed}))}, at "
                        f"{', '.join(sorted({n.build for n in failed}))}")
        for status in JUDGED:
            mine = [n for n in nights if n.status == status]
            if mine:
                said.append(f"{status.lower()}: first {mine[0].night} ({mine[0].build}), last "
                            f"{mine[-1].night} ({mine[-1].build})")
        said += _changes(nights) + _cross_hardware(nights)
        out.append("\n  - ".join(said))
    return out


def _changes(nights: list[Night]) -> list[str]:
    """A change of verdict between two consecutive nights of one machine, both builds named."""
    out = []
    for machine in sorted({n.machine for n in nights}):
        mine = [n for n in nights if n.machine == machine]
        for i in range(1, len(mine)):
            before, after = mine[i - 1], mine[i]
            if before.status == after.status:
                continue
            j = i - 1
            while j > 0 and mine[j - 1].status == before.status:
                j -= 1
            verb = "passes" if after.status == PASSED else "fails"
            was = "failed" if before.status == FAILED else "passed"
            out.append(f"{machine}: {verb} from `{after.build}` on {after.night}; {was} on "
                       f"every earlier night since {mine[j].night} (last at `{before.build}` "
                       f"on {before.night})")
    return out


def _cross_hardware(nights: list[Night]) -> list[str]:
    """The same commit on two machines: where their verdicts (or worst ratios) differ."""
    out = []
    by_commit: dict[str, list[Night]] = {}
    for n in nights:
        if n.commit:
            by_commit.setdefault(n.commit[:7], []).append(n)
    for commit, same in sorted(by_commit.items()):
        machines = {n.machine for n in same}
        if len(machines) < 2:
            continue
        statuses = {n.status for n in same}
        cells = ", ".join(f"{n.machine} {n.status.lower()} ({worst_text(n.ratio)}x)"
                          for n in same)
        verdict = "differ" if len(statuses) > 1 else "agree"
        out.append(f"cross-hardware pair at {commit}: {cells}: the verdicts {verdict}")
    return out


# -------------------------------------------------------------------------- report


# The markdown grid's columns: the newest nights (the picture holds every night).
GRID_COLUMNS = 14


Column = tuple[str, str, str]  # (night, machine, build): one run folder


def _column(n: Night) -> Column:
    return n.night, n.machine, n.build


def _columns(nights) -> list[Column]:
    return sorted({_column(n) for ns in nights.values() for n in ns})


def _headers(columns: Sequence[Column], separator: str) -> list[str]:
    """Each column's header: its night and machine, and its build where another run folder
    shares both (two branches run the same night)."""
    shared = {(night, machine) for i, (night, machine, _) in enumerate(columns)
              if any(c[:2] == (night, machine) for c in columns[:i] + columns[i + 1:])}
    return [separator.join([night, machine] + ([build] if (night, machine) in shared else []))
            for night, machine, build in columns]


def _case_name(label: str, dtype: str) -> str:
    """The case as a row names it: its dtype added where neither float32 nor in its name."""
    return label if dtype == "float32" or dtype in label else f"{label} {dtype}"


def grid_picture(rows: Sequence[Judged], path: Path) -> Path | None:
    """The whole archive's cases x nights as a PNG (harness.logs.grid_plot); None when no case
    was judged."""
    nights = _nights(rows)
    columns = _columns(nights)
    if not columns:
        return None
    from .grid_plot import draw_grid  # matplotlib's import only where a picture is drawn
    keys = sorted(nights)
    index = {c: j for j, c in enumerate(columns)}
    cells = {(i, index[_column(n)]): n.ratio for i, key in enumerate(keys) for n in nights[key]}
    return draw_grid([_case_name(*key) for key in keys], _headers(columns, " "), cells, path)


def grid(rows: Sequence[Judged]) -> list[str]:
    """Cases x run folders (a night on a machine a column, the newest GRID_COLUMNS): each cell
    the worst |diff| over its limit, `✗` where it failed, `·` where the case was not judged
    there."""
    nights = _nights(rows)
    columns = _columns(nights)
    if not columns:
        return ["no case judged against a reference"]
    note = []
    if len(columns) > GRID_COLUMNS:
        note = [f"The newest {GRID_COLUMNS} of {len(columns)} columns; the picture above "
                "holds them all.", ""]
        columns = columns[-GRID_COLUMNS:]
    head = "| case | " + " | ".join(_headers(columns, "<br>")) + " |"
    out = note + [head, "|" + " --- |" * (len(columns) + 1)]
    for key, ns in sorted(nights.items()):
        at = {_column(n): n for n in ns}
        cells = []
        for column in columns:
            n = at.get(column)
            if n is None:
                cells.append("·")
            else:
                mark = "✗ " if n.status == FAILED else ""
                cells.append(f"{mark}{worst_text(n.ratio)}")
        out.append(f"| {_case_name(*key)} | " + " | ".join(cells) + " |")
    return out


def report_md(rows: Sequence[Judged], given: Sequence[str], notes: Sequence[str] = (),
              picture: str | None = None) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    folders = sorted({r.place.label for r in rows if r.place is not None})
    out = ["# Recorded runs judged against their one-device reference", "",
           f"Runs: {', '.join(map(str, given))} ({len(folders)} run folder(s))", "",
           "| " + " | ".join(f"{k}: {v}" for k, v in counts.items()) + " |",
           "|" + " --- |" * len(counts), "",
           "A case is judged against the recorded one-device run of the same mathematics in "
           "its own run folder (else the least-parallel run of it, said so): the loss per step "
           "at the dtype's threshold, never below the print resolution. A cell is the worst "
           "|diff| over that limit (over 1 fails).", "",
           "## Cases x nights", ""] + ([f"![cases x nights]({picture})", ""] if picture
                                         else []) + grid(rows)
    found = case_findings(rows)
    out += ["", "## Across nights and machines", ""]
    out += [f"- {f}" for f in found] or ["nothing judged on more than one night"]
    failed = [r for r in rows if r.status == FAILED]
    out += ["", "## Failures", ""]
    out += [f"- {_cell(r.line())}" for r in failed] or ["none"]
    out += ["", "## Every case", "", "| run folder | case | dtype | status | reference "
            "| first diverging step | worst \\|diff\\| / limit | threshold |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        v = r.verdict
        ref = (r.reference.label + ("" if r.one_device else " (stand-in)")
               if r.reference is not None and r.status in JUDGED else "-")
        first = v.first_diverging_step if v is not None and v.first_diverging_step else "-"
        out.append(f"| {r.place.label if r.place else '?'} | {r.label} | {r.dtype} "
                   f"| {r.status} | {ref} | {first} | {worst_text(r.worst_ratio)} "
                   f"| {v.threshold if v is not None else '-'} |")
    other = [r for r in rows if r.status in (NOT_JUDGED, NO_REFERENCE, BAD)]
    out += ["", "## Not judged, no reference, bad input", ""]
    out += [f"- {_cell(r.line())}" for r in other] or ["none"]
    if notes:
        out += ["", "## Notes", ""] + [f"- {_cell(n)}" for n in notes]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


__all__ = ["FINDINGS_FORMAT", "case_findings", "finding", "grid", "judge_reading",
           "report_md", "write_findings", "REFERENCE"]
