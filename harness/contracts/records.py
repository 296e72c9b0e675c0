"""Machine-readable run records, and the one module that reads and writes their files:
`run.json`, `steps.jsonl` and the session's `results.jsonl`. The harness reads these instead of
parsing log lines.

Why here, in harness.contracts: the trainer writes run.json and steps.jsonl and may import only
harness.contracts (tests/contracts/test_contracts.py), while the runner, the report, the references and
the benchmarks read them; a module both sides import is the one place their I/O can live. It
holds the bytes-and-lines rules (file names, formats, the tolerant and strict JSONL readers, the
locked append); what a result record means is the type's (harness.results.result_record), whose
typed reader and writer (harness.results.records) are built on this module. Torch-free.

The trainer writes with RunRecorder; the harness reads with read_steps (strict) or read_jsonl
(tolerant: a run killed mid-write leaves a half-written last line) and writes steps.jsonl for a
foreign trainer that only printed its steps with write_steps. The `environment` block of
run.json is gathered by the trainer (harness.trainer.main.environment).

Files under --output_dir, written by the one rank that reports the loss:

- `run.json`: format version, the flags, the environment (torch, device, world, mesh), the
  model config, the normalized layout and the parallel setup (mesh sizes, vpp, the pipeline
  schedule run, microbatches per step).
- `steps.jsonl`: one JSON object per optimizer step, floats at full precision (Python's repr
  round-trips a float64 exactly).
- `layout.txt`: the layout as printed at start-up, for people.

And in a session folder: `results.jsonl`, one result record per case (docs/results_format.md),
appended with append_jsonl.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, NamedTuple

RUN_FORMAT = "harness.run/1"
STEP_FORMAT = "harness.step/1"
RUN_NAME = "run.json"
STEPS_NAME = "steps.jsonl"
RESULTS_NAME = "results.jsonl"


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float
    lr: float
    step_time_ms: float
    tokens_per_s: float
    peak_memory_mb: float

    def to_json(self) -> str:
        return json.dumps({"format": STEP_FORMAT, **asdict(self)})


def format_step_line(
    record: StepRecord, num_iteration: int, dp: int, tp: int, pp: int
) -> str:
    """InfiniTrain's per-step log line (its scripts grep this exact shape)."""
    return (
        f"step {record.step:4d}/{num_iteration} | train loss {record.loss:.6f} | "
        f"lr {record.lr:.2e} | ({record.step_time_ms:.1f} ms | {record.tokens_per_s:.0f} tok/s | "
        f"peak used: {record.peak_memory_mb:.0f} MB | DP={dp}, TP={tp}, PP={pp})"
    )


class RunRecorder:
    """Writes the records of one run; a recorder with no folder writes nothing."""

    def __init__(self, output_dir: str | os.PathLike | None) -> None:
        self.output_dir = Path(output_dir) if output_dir else None
        if self.output_dir is not None:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # A rerun into the same folder must not append to an old run's steps.
            (self.output_dir / STEPS_NAME).write_text("")

    def write_run(
        self, flags: Any, env: dict, model_config: Any, layout: Any, parallel: dict
    ) -> None:
        """`parallel`: pp, dp, tp, vpp, the pipeline schedule actually run (None without a
        pipeline) and the microbatches per step over all data-parallel ranks."""
        if self.output_dir is None:
            return
        record = {
            "format": RUN_FORMAT,
            "flags": asdict(flags) if is_dataclass(flags) else dict(flags),
            "environment": env,
            "model_config": asdict(model_config) if is_dataclass(model_config) else model_config,
            "layout": layout.to_dict(),
            "layout_text": str(layout),
            "parallel": parallel,
        }
        (self.output_dir / RUN_NAME).write_text(json.dumps(record, indent=2) + "\n")
        (self.output_dir / "layout.txt").write_text(str(layout) + "\n")

    def write_step(self, record: StepRecord) -> None:
        if self.output_dir is None:
            return
        with open(self.output_dir / STEPS_NAME, "a") as stream:
            stream.write(record.to_json() + "\n")


class JsonLine(NamedTuple):
    """One non-blank line of a JSONL file: its value, or why it has none. (A named tuple, not
    a frozen dataclass: a year of history is 73,000 lines, and a frozen dataclass's __init__
    cost as much as parsing them.)"""
    number: int  # from 1
    text: str
    value: Any = None
    problem: str | None = None  # "not JSON (...)", or "truncated (...)" for a cut last line


def scan_jsonl(path: str | os.PathLike) -> list[JsonLine]:
    """Every non-blank line of a JSONL file, parsed or with its problem; nothing raises on
    content (bytes that are not UTF-8 become U+FFFD). A last line with no newline that is not
    JSON is `truncated`: the writer was stopped in the middle of it. OSError when the file
    cannot be read."""
    return scan_jsonl_text(Path(path).read_bytes().decode("utf-8", errors="replace"))


def scan_jsonl_text(raw: str, first_number: int = 1) -> list[JsonLine]:
    """scan_jsonl of a file's text, or of its tail from line `first_number` on (a reader that
    holds the lines before it already)."""
    lines = raw.split("\n")
    found = []
    last = first_number + len(lines) - 1
    for number, text in enumerate(lines, start=first_number):
        if not text.strip():
            continue
        try:
            found.append(JsonLine(number, text, json.loads(text)))
        except json.JSONDecodeError as error:
            cut = number == last and not raw.endswith("\n")
            problem = ("truncated (the writer stopped in the middle of it)" if cut
                       else f"not JSON ({error.msg} at column {error.colno})")
            found.append(JsonLine(number, text, problem=problem))
    return found


def read_jsonl(path: str | os.PathLike, missing_ok: bool = True) -> list[Any]:
    """The values of a JSONL file, tolerantly: no file (or an unreadable one) is no values, and
    a line that is not JSON (a half-written last line from a killed run) is left out. With
    missing_ok=False a file that is not there is an OSError (a path someone typed)."""
    try:
        lines = scan_jsonl(path)
    except OSError:
        if not missing_ok:
            raise
        return []
    return [line.value for line in lines if line.problem is None]


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's value, or None when it is missing, unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_atomic(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write `text` (or bytes) to a scratch file beside `path`, then rename it into place: a
    reader in another process (or thread) sees the old file or the whole new one, never a
    part."""
    import uuid

    path = Path(path)
    scratch = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        if isinstance(text, bytes):
            scratch.write_bytes(text)
        else:
            scratch.write_text(text)
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
    return path


def read_run(output_dir: str | os.PathLike) -> dict | None:
    """A run's run.json, or None when the run wrote none (or a broken one)."""
    record = read_json(Path(output_dir) / RUN_NAME)
    return record if isinstance(record, dict) else None


def append_jsonl(path: str | os.PathLike, value: Any) -> None:
    """Append one JSON line under a file lock (`<path>.lock`), flushed and fsync'ed: writers in
    several processes (pytest-xdist workers) never interleave or lose a line. NaN and infinity
    are refused (they are not JSON): a caller spells them as strings first."""
    from filelock import FileLock  # here: the trainer imports this module and never appends

    line = json.dumps(value, allow_nan=False) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        with open(path, "a") as stream:
            stream.write(line)
            stream.flush()
            os.fsync(stream.fileno())


def read_steps(output_dir: str | os.PathLike) -> list[dict]:
    """The step records of a run, in order; raises ValueError on a record of another format."""
    path = Path(output_dir) / STEPS_NAME
    records = []
    for line in scan_jsonl(path):
        if line.problem:
            raise ValueError(f"{path}:{line.number}: {line.problem}")
        record = line.value
        if not isinstance(record, dict) or record.get("format") != STEP_FORMAT:
            raise ValueError(
                f"{path}:{line.number}: record format "
                f"{record.get('format') if isinstance(record, dict) else None!r}, "
                f"expected {STEP_FORMAT!r}"
            )
        records.append(record)
    return records


def write_steps(path: Path, steps: list[dict]) -> None:
    """steps.jsonl for a backend that printed its steps instead of writing them (reading goes
    through read_jsonl, which skips a half-written line). Every field
    of a parsed step is kept, `loss_resolution` (the printed loss's last place) included, so a
    cached reference is compared at the resolution it was printed with."""
    path.write_text("".join(json.dumps({"format": STEP_FORMAT, **s}) + "\n" for s in steps))
