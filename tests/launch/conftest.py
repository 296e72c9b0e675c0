"""Launcher tests: the real trainer on the tiny assets, run through HarnessBackend.launch under
torchrun and under the zygote."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

SHIM = Path(__file__).parent / "shim"
# The basic tag's PP2 case (configs/test_config.json), 4 steps.
FLAGS = {"dtype": "float32", "batch_size": 2, "sequence_length": 32, "num_iteration": 4,
         "learning_rate": 0.001, "weight_decay": 0.0, "optimizer": "sgd", "seed": 42,
         "pipeline_parallel": 2, "total_batch_size": 512}


@dataclass(frozen=True)
class LaunchSettings:  # what HarnessBackend.launch reads of the runner's Settings
    launcher: str
    timeout_s: float = 300.0


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """The fault shim on PYTHONPATH of this process (so the zygote, started or restarted from
    it, loads it as torchrun's ranks do); pids recorded under tmp_path / records."""
    records = tmp_path / "records"
    records.mkdir()
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FAULT_RECORD_DIR", str(records))
    return records


@pytest.fixture
def launch(tiny_assets, tmp_path):
    """launch(launcher, case_id, world_size=2, timeout_s=300) -> (spec, result) of one run."""
    from harness.launch import HarnessBackend, LaunchSpec, free_port

    backend = HarnessBackend()

    def run(launcher: str, case_id: str = "ok", world_size: int = 2, timeout_s: float = 300.0,
            flags: dict | None = None):
        out = tmp_path / launcher / case_id
        flags = dict(FLAGS if flags is None else flags)
        if world_size == 1:
            flags.pop("pipeline_parallel", None)
        spec = LaunchSpec(case=f"launch/gpt2/{case_id}", model="gpt2", flags=flags,
                          world_size=world_size, checkpoint=tiny_assets.checkpoint("gpt2"),
                          input_bin=tiny_assets.tokens("gpt2", "train"), output_dir=out,
                          gradients_dir=out / "gradients", log_dir=out / "logs",
                          port=free_port(), slots=list(range(world_size)))
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        return spec, backend.launch(spec, LaunchSettings(launcher, timeout_s))

    run.backend = backend
    return run


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node Slurm cluster (tests/launch/slurm_cluster.py) for this worker's session, or a
    skip naming why it cannot start."""
    import time

    from .slurm_cluster import SlurmUnavailable, start_cluster

    started = time.monotonic()
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as error:
        pytest.skip(f"slurm: {error}")
    except OSError as error:
        pytest.skip(f"slurm: cannot start the daemons: {error}")
    cluster.started_s = time.monotonic() - started
    yield cluster
    cluster.stop()
