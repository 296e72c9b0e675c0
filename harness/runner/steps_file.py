"""Writing a run's steps.jsonl for a backend that printed its steps instead of writing them
(reading goes through harness.launch.backends.read_jsonl, which skips a half-written line)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.spec.records import STEP_FORMAT


def write_steps(path: Path, steps: list[dict]) -> None:
    path.write_text("".join(json.dumps({"format": STEP_FORMAT, **s}) + "\n" for s in steps))
