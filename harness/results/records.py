"""Every case's result as structured data: one JSON object per line in the session's results
file, appended under a file lock (one write per record, flushed and fsync'ed), so pytest-xdist
workers never lose or interleave records. `python -m harness.report` reads these files.

Record (format harness.result/2), every key always present (null where it does not apply):

    format, session, worker, nodeid, name (tag/model/id), tag, model, case_id, description,
    status (passed | failed | skipped | error), reason (one line), errors (list of texts),
    world_size, parallel {pp, tp, dp, vpp, sequence_parallel}, trainer (the backend: harness,
    command, infinitrain), flags (the flags the run was launched with), passthrough_flags
    (the case's flags the flag table does not know, passed to the trainer as written),
    layout (run.json's layout dict), layout_text, device, devices (leased slots),
    compare {loss, gradients}, tolerances {loss {atol, rtol}, gradients {atol, rtol}},
    loss (diff summary: steps, mismatched, max_abs_diff, first_diverging_step, ...),
    gradients (diff summary: parameters, mismatched, missing, extra, worst [..],
    per_layer [..], ...),
    losses (the run's loss per step), reference_losses,
    tokens_per_s (mean over steps after the first), peak_memory_mb (max), step_time_ms (mean),
    step_times_ms (each step after the first, for the report's spread),
    reference {key, path, built, command}, command (argv), returncode, timed_out, failing_rank,
    logs {launcher_stdout, launcher_stderr, ranks {rank: [paths]}}, output_dir,
    environment (run.json's environment), timings {lease_wait_s, reference_s, run_s,
    compare_s, total_s}, started_at, finished_at
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from filelock import FileLock

RESULT_FORMAT = "harness.result/2"
# Formats the readers accept: /2 added `trainer` and `passthrough_flags` (absent in /1 records).
READABLE_FORMATS = ("harness.result/1", RESULT_FORMAT)
FIELDS = (
    "format", "session", "worker", "nodeid", "name", "tag", "model", "case_id", "description",
    "status", "reason", "errors", "world_size", "parallel", "trainer", "flags",
    "passthrough_flags", "layout", "layout_text",
    "device", "devices", "compare", "tolerances", "loss", "gradients", "losses",
    "reference_losses", "tokens_per_s", "peak_memory_mb", "step_time_ms", "step_times_ms",
    "reference",
    "command", "returncode", "timed_out", "failing_rank", "logs", "output_dir", "environment",
    "timings", "dumps", "disk_bytes", "started_at", "finished_at",
)
STATUSES = ("passed", "failed", "skipped", "error")


def new_record(**values: Any) -> dict:
    record = {name: None for name in FIELDS}
    record["format"] = RESULT_FORMAT
    record["errors"] = []
    record.update(values)
    return record


def _clean(value: Any) -> Any:
    """JSON-safe: NaN / inf as strings, paths as strings, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class ResultsWriter:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def append(self, record: dict) -> None:
        unknown = set(record) - set(FIELDS)
        if unknown:
            raise ValueError(f"result record has unknown fields {sorted(unknown)}")
        if record.get("status") not in STATUSES:
            raise ValueError(f"result status {record.get('status')!r}; expected one of {STATUSES}")
        line = json.dumps(_clean(record), sort_keys=False, allow_nan=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            with open(self.path, "a") as stream:
                stream.write(line)
                stream.flush()
                os.fsync(stream.fileno())


def read_results(path: str | os.PathLike) -> list[dict]:
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if line.strip():
            record = json.loads(line)
            if record.get("format") not in READABLE_FORMATS:
                raise ValueError(f"{path}:{number}: format {record.get('format')!r}, "
                                 f"expected {RESULT_FORMAT!r}")
            records.append(record)
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
