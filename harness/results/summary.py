"""The lines a pytest session of harness cases ends with (its "harness session" section): the
session folder, the trainer under test, each (tag, model)'s status counts, then what the
session adds (calibration, history, the baseline check) and the report command."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.contracts.records import read_jsonl

from .baseline_summary import baseline_summary

STATUSES = ("passed", "failed", "skipped", "error")


def status_counts(records: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """Per (tag, model), in name order: how many records have each status (a rerun's
    duplicate counts once, the last record winning; unreadable lines are left to the report)."""
    last: dict[str, dict] = {}
    for record in records:
        if isinstance(record, dict) and record.get("name") and record.get("status"):
            last[record["name"]] = record
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for record in last.values():
        key = (str(record.get("tag")), str(record.get("model")))
        row = counts.setdefault(key, {s: 0 for s in STATUSES})
        row[record["status"]] = row.get(record["status"], 0) + 1
    return dict(sorted(counts.items()))


def summary_lines(session_dir: Path, trainer: dict | None, added: list[str]) -> list[str]:
    """The section's lines for the session in `session_dir` (none without a results file);
    `added`: lines the session contributes after the counts (calibration, history)."""
    results = session_dir / "results.jsonl"
    if not results.is_file():
        return []
    lines = [f"session folder: {session_dir.resolve()}"]
    if trainer:
        build = f", build {trainer['build_dir']}" if trainer.get("build_dir") else ""
        lines.append(f"trainer: {trainer['name']} ({trainer.get('version')}{build}), "
                     f"device {trainer.get('device')}")
    records = [r for r in read_jsonl(results) if isinstance(r, dict)]
    for (tag, model), counts in status_counts(records).items():
        text = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        lines.append(f"  {tag} / {model}: {text}")
    lines.extend(added)
    baseline = baseline_summary(records)
    if baseline:
        lines.append(baseline)
    lines.append(f"report: python -m harness.report {shlex.quote(str(session_dir.resolve()))}")
    return lines
