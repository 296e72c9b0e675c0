"""Where a recorded InfiniTrain run comes from: its run folder, machine, night, branch and
commit. The one reader of a run folder's place, for the self-check (harness.logs.selfcheck)
and the history's import (harness.history.run_folders).

InfiniTensor/InfiniTrain-Test keeps each night as
`infinitrain/logs/<machine>/<YYYYMMDD>/<branch>_<sha>/logs/[<tag>/]<model>_<case>.log` (older
ones `<sha>_<branch>`, newer ones with a `run_metadata.log`: docs/recorded_runs.md). A log outside
that shape is its own folder's run. The date is the metadata's `[RUN_STARTED_AT]`, else the
earliest glog time of a step line, else the date folder; branch and commit are the metadata's,
else the folder name's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_GLOG_TIME = re.compile(r"^[IWEF](\d{8}) (\d\d:\d\d:\d\d)", re.M)
_DAY = re.compile(r"\d{8}")


def branch_commit(name: str) -> tuple[str | None, str | None]:
    """`master_e7d57db` or `e7d57db_master` -> (branch, commit)."""
    first, sep, rest = name.partition("_")
    if not sep:
        return None, (first if _SHA.match(first) else None)
    if _SHA.match(rest) and not _SHA.match(first):
        return first, rest
    if _SHA.match(first):
        return rest, first
    head, _, tail = name.rpartition("_")
    return (head, tail) if _SHA.match(tail) else (name, None)


def run_root(log: Path) -> Path | None:
    """The `<branch>_<sha>` folder above a log's `logs/` folder, or None."""
    for folder in log.parents:
        if folder.name == "logs":
            return folder.parent
    return None


def run_date(meta: dict, text: str, root: Path | None) -> str | None:
    """The run's start (ISO): `[RUN_STARTED_AT]`, else the first glog time in `text`, else
    the `YYYYMMDD` folder above the run folder; None when none says."""
    started = meta.get("run_started_at")
    if started:
        for parse in (datetime.fromisoformat,
                      lambda s: datetime.strptime(s, "%Y-%m-%d %H:%M:%S")):
            try:
                return parse(started.replace("Z", "+00:00")).isoformat()
            except ValueError:
                pass
    m = _GLOG_TIME.search(text)
    if m:
        return datetime.strptime(" ".join(m.groups()), "%Y%m%d %H:%M:%S").isoformat()
    if root is not None and _DAY.fullmatch(root.parent.name):
        return datetime.strptime(root.parent.name, "%Y%m%d").isoformat()
    return None


@dataclass(frozen=True)
class RunPlace:
    """A run folder's place: what the path and the metadata say of it."""

    root: Path  # the run folder (`<branch>_<sha>`), or the log's own folder
    machine: str | None
    night: str | None  # the date folder, YYYY-MM-DD
    branch: str | None
    commit: str | None
    # `machine/YYYYMMDD/branch_sha` as the archive spells it, else the folder's path
    label: str


def run_place(log: Path, meta: dict) -> RunPlace:
    """The place of a log's run (`meta`: the log's and its run_metadata.log's keys). A branch
    with a `/` (`fix/reducer_grad_accu`) makes folders of its own between the night and the
    run folder: their names are the branch's."""
    root = run_root(log)
    folder = root if root is not None else log.parent
    day_folder = None
    if root is not None:
        day_folder = next((up.parent for up in [root, *root.parents][:4]
                           if _DAY.fullmatch(up.parent.name)), None)
    if day_folder is not None:
        branch, commit = branch_commit(root.relative_to(day_folder).as_posix())
        day, machine = day_folder.name, day_folder.parent.name
    else:
        branch, commit = branch_commit(root.name) if root is not None else (None, None)
        day = machine = None
    label = (f"{machine}/{day}/{root.relative_to(day_folder).as_posix()}" if day_folder
             else str(folder))
    return RunPlace(folder, machine, f"{day[:4]}-{day[4:6]}-{day[6:]}" if day else None,
                    meta.get("git_branch") or branch, meta.get("git_commit") or commit, label)
