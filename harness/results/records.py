"""Every case's result as structured data: one JSON object per line in the session's results
file, appended under a file lock (one write per record, flushed and fsync'ed:
harness.contracts.records.append_jsonl, the one records I/O module), so pytest-xdist workers never
lose or interleave records. `python -m harness.report` reads these files.

The record itself, its fields and their meanings: harness.results.result_record (ResultRecord,
FIELDS; docs/results_format.md's key table is generated from it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.contracts.records import append_jsonl, scan_jsonl

from .result_record import (  # noqa: F401 (re-exported: the names readers import from here)
    FIELDS,
    READABLE_FORMATS,
    RESULT_FORMAT,
    STATUSES,
    ResultRecord,
    _clean,
)

__all__ = ["FIELDS", "READABLE_FORMATS", "RESULT_FORMAT", "STATUSES", "ResultRecord",
           "ResultsWriter", "junit_properties", "new_record", "read_results"]


def new_record(**values: Any) -> dict:
    record = {name: None for name in FIELDS}
    record["format"] = RESULT_FORMAT
    record["errors"] = []
    record.update(values)
    return record


class ResultsWriter:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def append(self, record: dict | ResultRecord) -> None:
        if isinstance(record, ResultRecord):
            record = record.to_json()
        unknown = set(record) - set(FIELDS)
        if unknown:
            raise ValueError(f"result record has unknown fields {sorted(unknown)}")
        if record.get("status") not in STATUSES:
            raise ValueError(f"result status {record.get('status')!r}; expected one of {STATUSES}")
        append_jsonl(self.path, _clean(record))


def read_results(path: str | os.PathLike) -> list[dict]:
    """Every record of a results file, strictly (a bad format or an unknown key is a ValueError
    naming the file and line), as dicts with every key of FIELDS."""
    records = []
    for line in scan_jsonl(path):
        where = f"{path}:{line.number}"
        if line.problem:
            raise ValueError(f"{where}: {line.problem}")
        records.append(ResultRecord.from_json(line.value, where=where).to_json())
    return records


def junit_properties(record: dict) -> list[tuple[str, str]]:
    """The record's headline numbers as junit <property> pairs (strings)."""
    props = [("harness_status", record["status"]), ("harness_name", record["name"])]
    loss, grads = record.get("loss") or {}, record.get("gradients") or {}
    for key, value in (
        ("loss_max_abs_diff", loss.get("max_abs_diff")),
        ("loss_mismatched", loss.get("mismatched")),
        ("gradients_max_abs_diff", grads.get("max_abs_diff")),
        ("gradients_mismatched", grads.get("mismatched")),
        ("tokens_per_s", record.get("tokens_per_s")),
        ("peak_memory_mb", record.get("peak_memory_mb")),
        ("world_size", record.get("world_size")),
        ("output_dir", record.get("output_dir")),
        ("reason", record.get("reason")),
        ("command", " ".join(record["command"]) if record.get("command") else None),
    ):
        if value is not None:
            props.append((key, str(value)))
    return props
