"""A toy trainer backend, added the way docs/design.md ("Adding a trainer backend") says: this
one file and one registry line (the `toy_parts` fixture of test_registered_parts.py registers
it).

Its ranks are started by the launcher the settings name (LauncherRanks); each runs this file as
`python -m tests.launch.toy_backend`: the "trainer", which writes what the harness reads from a
run (rank 0: steps.jsonl and one `<name>.npy` per parameter), the same on any world size. A case
whose id holds "crash" fails on purpose: rank 1 exits 3 at once, and rank 0 prints a traceback,
then exits 1 a second later.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harness.launch.backends import (
    LaunchSpec,
    LauncherRanks,
    RunOutputs,
    WholeGradientsFromStart,
    base_environment,
)
from harness.launch.launcher import RankRun
from harness.launch.process import ProcessResult
from harness.contracts.records import read_json, read_jsonl

ROOT = Path(__file__).resolve().parents[2]  # where `tests` is a package
PARAMETERS = ("wte.weight", "h.0.attn.c_proj.weight", "ln_f.weight")


class ToyBackend(LauncherRanks, WholeGradientsFromStart):
    name = "toy"
    module = "tests.launch.toy_backend"

    @classmethod
    def from_config(cls, config, facts_dir: Path | None = None) -> "ToyBackend":
        return cls()

    def version(self) -> str:
        return "toy-1"

    def trainer_args(self, spec: LaunchSpec) -> tuple[str, ...]:
        return (str(spec.output_dir), str(spec.gradients_dir or ""),
                str(spec.flags.get("num_iteration", 3)))

    def rank_run(self, spec: LaunchSpec, timeout_s: float) -> RankRun:
        return RankRun(self.module, self.trainer_args(spec), spec.world_size, spec.port,
                       self.environment(spec), spec.log_dir, timeout_s, self.working_dir(spec))

    def command(self, spec: LaunchSpec) -> list[str]:  # one process, by hand
        return [sys.executable, "-m", self.module, *self.trainer_args(spec)]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return base_environment(spec, {"PYTHONPATH": str(ROOT)})

    def working_dir(self, spec: LaunchSpec) -> Path | None:
        return None

    def collect(self, spec: LaunchSpec, result: ProcessResult) -> RunOutputs:
        return RunOutputs(steps=read_jsonl(spec.output_dir / "steps.jsonl"),
                          gradients_dir=spec.gradients_dir,
                          run_record=read_json(spec.output_dir / "run.json"))


def train(output_dir: Path, gradients_dir: str, steps: int) -> int:
    """One rank of the toy trainer; returns its exit code."""
    rank = int(os.environ.get("RANK", "0"))
    print(f"toy rank {rank} of {os.environ.get('WORLD_SIZE', '1')} starting", flush=True)
    if "crash" in os.environ["HARNESS_CASE"]:
        if rank == 1:
            return 3
        print("Traceback (most recent call last):\nRuntimeError: rank 0 lost its peer",
              flush=True)
        time.sleep(1.0)  # after rank 1: the launcher's record says which ended first
        return 1
    if rank == 0:
        import numpy as np

        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "steps.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 5.0 - 0.125 * s}) + "\n" for s in range(1, steps + 1)))
        if gradients_dir:
            Path(gradients_dir).mkdir(parents=True, exist_ok=True)
            for i, name in enumerate(PARAMETERS):
                np.save(Path(gradients_dir) / f"{name}.npy",
                        np.full((4, 3), 0.25 * (i + 1), np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(train(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
