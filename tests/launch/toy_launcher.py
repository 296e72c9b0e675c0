"""A toy launcher, added the way docs/design.md ("Adding a launcher") says: this one file and
one registry line (the `toy_parts` fixture of test_registered_parts.py registers it).

It starts a run's ranks as plain child processes of a leader (this file, run as a script), each
rank's output in `<log_dir>/toy-ranks/rank<R>.log` (its log layout), and records the rank whose
process ended first with a failure in `<log_dir>/toy-failure.json` (its failure record): a
layout and a record that neither torchrun nor the zygote has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from harness.launch.launcher import RankRun
from harness.launch.process import ProcessResult, run_process

FAILURE_FILE = "toy-failure.json"


class ToyLauncher:
    name = "toy"

    def command(self, run: RankRun) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), str(run.world_size),
                str(run.log_dir), run.module, *run.args]

    def launch(self, run: RankRun) -> ProcessResult:
        # run_process: under the reaper, with the timeout; every process is ended on the way out
        result = run_process(self.command(run), run.env, run.timeout_s, run.stdout, run.stderr,
                             cwd=run.cwd)
        return replace(result, launcher=self.name)

    def rank_logs(self, log_dir: Path, result: ProcessResult) -> dict[str, list[Path]]:
        return {path.stem[len("rank"):]: [path]
                for path in sorted((log_dir / "toy-ranks").glob("rank*.log"))}

    def failing_rank(self, log_dir: Path, result: ProcessResult) -> str | None:
        try:
            return str(json.loads((log_dir / FAILURE_FILE).read_text())["first_failed_rank"])
        except (OSError, ValueError, KeyError):
            return None


def lead(world_size: int, log_dir: Path, module: str, args: list[str]) -> int:
    """Start the ranks, wait for all; the first to fail is recorded. Returns the run's code."""
    folder = log_dir / "toy-ranks"
    folder.mkdir(parents=True, exist_ok=True)
    ranks = {}
    for rank in range(world_size):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size)}
        with open(folder / f"rank{rank}.log", "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                       stdout=log, stderr=subprocess.STDOUT)
        ranks[process.pid] = rank
    first = None
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0 and first is None:
            first = rank
    if first is None:
        return 0
    (log_dir / FAILURE_FILE).write_text(json.dumps({"first_failed_rank": first}))
    return 1


if __name__ == "__main__":
    sys.exit(lead(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]))
