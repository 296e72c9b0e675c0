"""Helpers for the plugin's tests: the plugin's -p argument, a fake-backend config."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import harness.plugin  # noqa: F401
import harness.runner  # noqa: F401

HERE = Path(__file__).parent
FAKE_TRAINER = HERE / "fake_trainer.py"


def plugin_args() -> list[str]:
    """`-p harness.plugin` until the pytest11 entry point is installed (then it loads itself)."""
    registered = any(ep.name == "harness" for ep in entry_points(group="pytest11"))
    return [] if registered else ["-p", "harness.plugin"]


def fake_config(tests, tag="fake", models=("gpt2",), extra=None, groups=None):
    """A config running the fake trainer through the command backend."""
    data = {
        "models": list(models),
        "model_files": {m: {"checkpoint": f"{m}.bin", "input_bin": f"{m}_tokens.bin"}
                        for m in ("gpt2", "llama3")},
        "trainer": {"backend": "command", "version": "fake-1", "command": [
            "{python}", str(FAKE_TRAINER), "--case", "{case}", "--world_size", "{world_size}",
            "--output_dir", "{output_dir}", "--gradients_dir", "{gradients_dir}",
            "--log_dir", "{log_dir}", "--model", "{model}", "--devices", "{devices}", "{flags}"]},
        "defaults": {"num_iteration": 3, "batch_size": 1, "sequence_length": 8},
        "test_groups": groups if groups is not None else [{"tag": tag, "tests": tests}],
    }
    data.update(extra or {})
    return data


@pytest.fixture
def harness_dir(pytester):
    """A pytester folder with dummy model files; returns a writer of the config."""
    for model in ("gpt2", "llama3"):
        (pytester.path / f"{model}.bin").write_bytes(model.encode() * 8)
        (pytester.path / f"{model}_tokens.bin").write_bytes(b"tokens" * 8)
    (pytester.path / "records").mkdir()

    def write(data) -> Path:
        path = pytester.path / "cases.json"
        path.write_text(json.dumps(data, indent=2))
        return path

    return write


def harness_args(pytester, *more) -> list[str]:
    return [*plugin_args(), "--harness-config", str(pytester.path / "cases.json"),
            "--harness-output", str(pytester.path / "out"), "--harness-device", "cpu",
            "-p", "no:cacheprovider", *more]
