"""A run's steps.jsonl (harness.step/1 lines): the reference's, read for the diff, and written
for a backend that printed its steps instead."""

from __future__ import annotations

import json
from pathlib import Path

from harness.launch.backends import read_jsonl


def read_steps(path: Path) -> list[dict]:
    return read_jsonl(path)


def write_steps(path: Path, steps: list[dict]) -> None:
    path.write_text("".join(json.dumps({"format": "harness.step/1", **s}) + "\n" for s in steps))
