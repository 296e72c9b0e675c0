"""Machine-readable run records: what the harness reads instead of parsing log lines.

The format both sides share (the trainer writes with RunRecorder, the harness reads with
read_steps or writes steps.jsonl for a foreign trainer that only printed its steps with
write_steps); torch-free. The
`environment` block of run.json is gathered by the trainer (harness.trainer.main.environment).

Files under --output_dir, written by the one rank that reports the loss:

- `run.json`: format version, the flags, the environment (torch, device, world, mesh), the
  model config, the normalized layout and the parallel setup (mesh sizes, vpp, the pipeline
  schedule run, microbatches per step).
- `steps.jsonl`: one JSON object per optimizer step, floats at full precision (Python's repr
  round-trips a float64 exactly).
- `layout.txt`: the layout as printed at start-up, for people.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

RUN_FORMAT = "harness.run/1"
STEP_FORMAT = "harness.step/1"


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
            (self.output_dir / "steps.jsonl").write_text("")

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
        (self.output_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n")
        (self.output_dir / "layout.txt").write_text(str(layout) + "\n")

    def write_step(self, record: StepRecord) -> None:
        if self.output_dir is None:
            return
        with open(self.output_dir / "steps.jsonl", "a") as stream:
            stream.write(record.to_json() + "\n")


def read_steps(output_dir: str | os.PathLike) -> list[dict]:
    """The step records of a run, in order; raises ValueError on a record of another format."""
    path = Path(output_dir) / "steps.jsonl"
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("format") != STEP_FORMAT:
            raise ValueError(
                f"{path}:{number}: record format {record.get('format')!r}, expected {STEP_FORMAT!r}"
            )
        records.append(record)
    return records


def write_steps(path: Path, steps: list[dict]) -> None:
    """steps.jsonl for a backend that printed its steps instead of writing them (reading goes
    through harness.launch.backends.read_jsonl, which skips a half-written line). Every field
    of a parsed step is kept, `loss_resolution` (the printed loss's last place) included, so a
    cached reference is compared at the resolution it was printed with."""
    path.write_text("".join(json.dumps({"format": STEP_FORMAT, **s}) + "\n" for s in steps))
