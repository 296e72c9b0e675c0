"""Config files for the tests of harness.cases: a minimal config, written to a temporary file."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def write(tmp_path, data) -> Path:
    path = tmp_path / "test_config.json"
    path.write_text(json.dumps(data))
    return path


def minimal(**extra):
    data = {"test_groups": [{"tag": "basic", "tests": [{"id": "pp2", "args": {"pipeline_parallel": 2}}]}]}
    data.update(extra)
    return data


def changed(path, change):
    """``path`` rewritten with ``change`` applied to its JSON."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path
