"""Checkpoint / resume cases of a foreign trainer (InfiniTrain's `save` / `load` flags).

Their paths are moved under the session, per model (`<session>/checkpoints/<model>/<path>`), so
a run never writes into the config's folders and GPT-2 and LLaMA 3 never share one. A resume
case (`load=<root>/x/checkpoint_step_000030`) waits for the case that saves `<root>/x` in this
session to finish (under pytest-xdist it may run on another worker at the same time), then runs,
or is skipped with the reason when that case failed or never ran.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.contracts.flags import CHECKPOINT_PATH_FLAGS
from harness.contracts.records import scan_jsonl, write_atomic

DONE = ".harness-done.json"  # written beside a `save` root when its run has ended
POLL_S = 0.5


def reroot_checkpoints(args: dict[str, Any], root: Path) -> dict[str, Any]:
    """`args` with every checkpoint path flag moved under `root` (absolute or relative)."""
    moved = dict(args)
    for name in CHECKPOINT_PATH_FLAGS:
        if isinstance(moved.get(name), str) and moved[name]:
            moved[name] = str(root / moved[name].lstrip("/"))
    return moved


def _source_of(load: str) -> Path:
    """The `save` root a `load` path comes from: the folder above `checkpoint_step_N`."""
    path = Path(load)
    while path.name and not path.name.startswith("checkpoint_step_"):
        path = path.parent
    return path.parent if path.name else Path(load).parent


def mark_checkpoint_done(flags: dict[str, Any], ok: bool, overwrite: bool = True) -> None:
    """Say that the run saving into `flags["save"]` has ended (and whether it succeeded);
    `overwrite=False` only fills in for a case that ended before its run (an error)."""
    save = flags.get("save")
    if isinstance(save, str) and save:
        Path(save).mkdir(parents=True, exist_ok=True)
        if overwrite or not (Path(save) / DONE).is_file():
            # Atomic: a resuming case on another worker polls this file, and a half-written
            # one reads as "the saver failed".
            write_atomic(Path(save) / DONE, json.dumps({"ok": ok}))


def wait_for_checkpoint(flags: dict[str, Any], timeout_s: float,
                        poll_s: float = POLL_S) -> str | None:
    """None when the checkpoint to resume from is there (waiting for the run that saves it);
    else the reason to skip the case."""
    load = flags.get("load")
    if not isinstance(load, str) or not load:
        return None
    source = _source_of(load)
    deadline = time.monotonic() + timeout_s
    while True:
        done = source / DONE
        if done.is_file():
            try:
                ok = json.loads(done.read_text()).get("ok")
            except (OSError, ValueError):
                ok = False
            if not ok:
                return f"resumes from {load}, but the run that saves {source} failed"
            if not Path(load).is_dir():
                return f"resumes from {load}, which the run that saves {source} did not write"
            return None
        if not _planned(source):
            return (f"resumes from {load}: no case of this session saved {source} (run the "
                    f"case that saves it in the same session)")
        if time.monotonic() > deadline:
            return (f"resumes from {load}: the run that saves {source} did not end within "
                    f"{timeout_s:g} s")
        time.sleep(poll_s)


def _planned(source: Path) -> bool:
    """Whether a case selected in this session saves into `source` (announced by every
    pytest worker when collection ends: see `announce_checkpoint`)."""
    return (source.parent / (source.name + ".planned")).is_file()


def announce_checkpoint(flags: dict[str, Any]) -> None:
    """Say that a case of this session will save into `flags["save"]`."""
    save = flags.get("save")
    if isinstance(save, str) and save:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        (Path(save).parent / (Path(save).name + ".planned")).touch()


def settle_session_checkpoints(results: Path, keep: str) -> list[Path]:
    """settle_checkpoints over a session's results file. A line that cannot be read (a
    record cut short by a killed worker) may be a failed case's: then nothing is removed."""
    lines = scan_jsonl(results)
    if any(line.problem or not isinstance(line.value, dict) for line in lines):
        return []
    return settle_checkpoints([line.value for line in lines], keep)


def settle_checkpoints(records: list[dict], keep: str) -> list[Path]:
    """At session end: remove the checkpoints cases saved, as `--harness-keep-dumps` says of
    the other outputs (failed: kept where the saving case, or a case resuming from it, did not
    pass; all: kept; none: removed). Returns the folders removed."""
    import shutil

    if keep == "all":
        return []
    keep_roots: set[Path] = set()
    saved: list[Path] = []
    for record in records:
        flags = record.get("flags") or {}
        passed = record.get("status") in ("passed", "skipped")
        for name in CHECKPOINT_PATH_FLAGS:
            value = flags.get(name)
            if not isinstance(value, str) or not value:
                continue
            root = Path(value) if name != "load" else _source_of(value)
            if name != "load":
                saved.append(root)
            if not passed and keep == "failed":
                keep_roots.add(root)
    removed = []
    for root in dict.fromkeys(saved):
        if root not in keep_roots and root.is_dir():
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
    return removed
