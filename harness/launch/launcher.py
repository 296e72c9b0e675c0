"""The Launcher protocol: how a run's ranks start, where its failure is recorded, where each
rank's log is. torchrun (harness.launch.torchrun) and the zygote (harness.launch.zygote)
implement it; harness.registry names them; a trainer backend asks the launcher object,
never its name.

No torch here, and no harness module above harness.contracts: the registry and the backends import
it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

from .process import ProcessResult


@dataclass(frozen=True)
class RankRun:
    """One run's ranks as a launcher is asked to start them: world_size processes, each
    `python -m {module} {args}` with the standard distributed environment (RANK, WORLD_SIZE,
    MASTER_PORT, ...). The launcher's own output goes to `stdout` / `stderr`, and everything it
    writes stays under log_dir."""

    module: str
    args: tuple[str, ...]
    world_size: int
    port: int | None
    env: Mapping[str, str]
    log_dir: Path
    timeout_s: float
    cwd: Path | None = None

    @property
    def stdout(self) -> Path:
        return self.log_dir / "launcher.stdout"

    @property
    def stderr(self) -> Path:
        return self.log_dir / "launcher.stderr"

    def one_process(self) -> list[str]:
        """`python -m module args`: a run of one process needs no launcher of its own."""
        return [sys.executable, "-m", self.module, *self.args]


class Launcher(Protocol):
    """What a trainer backend asks of a launcher, declared in full."""

    name: str  # its registry name; ProcessResult.launcher says which launcher ran a run

    def command(self, run: RankRun) -> list[str]:
        """The argv that runs it (recorded as the run's command: by hand it reproduces the
        run)."""

    def launch(self, run: RankRun) -> ProcessResult:
        """Start the ranks and wait for them, up to run.timeout_s; every process it started is
        ended on every way out. The result's `launcher` names the launcher that ran it (one
        may hand a run it cannot serve to another)."""

    def rank_logs(self, log_dir: Path, result: ProcessResult) -> dict[str, list[Path]]:
        """Its log layout: each rank's log files, keyed by global rank ("0", "1", ...); {} when
        the ranks' output is the launcher's own files (one process)."""

    def failing_rank(self, log_dir: Path, result: ProcessResult) -> str | None:
        """Its failure record: the rank that failed first, read where this launcher records
        it; None when none is known."""


def rank_with_traceback(logs: dict[str, list[Path]]) -> str | None:
    """The lowest rank whose log shows a traceback or an error line: the last resort of a
    failure reading that has no record."""
    for rank in sorted(logs, key=lambda r: (len(r), r)):
        for path in logs[rank]:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if "Traceback" in text or "error:" in text:
                return rank
    return None
