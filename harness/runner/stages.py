"""The stages a run goes through: the ones a case shares with its reference, a calibration
repeat, the float64 oracle and the live PyTorch baseline (`lease`, `port`, `launch`,
`collect`, in that order by `run`), and the frozen result every stage returns, a case's own
stages' included (CasePlan, Referenced, Collected, Judged, Settled). No stage fills in a shared
record: a case's result record is assembled once, at the end, from these results
(harness.runner.record.assemble); `Reached` holds the ones a case got to. The list of stages a
case and a reference go through is in harness.runner.case_runner.

What differs between a case's run and the others' is what its RunTarget says (name, flags,
process count, folder, gradients, port), not the code that leases, launches and collects.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from harness.baseline.live import BaselineCheck
from harness.cases import Case
from harness.compare.case_verdict import CaseVerdict
from harness.compare.verdict import RelativeThresholds
from harness.launch import LaunchSpec, ProcessResult, RunOutputs, free_port
from harness.launch.placement import launch_run
from harness.reference import ReferenceEntry

from .settings import Outcome


@dataclass(frozen=True)
class RunTarget:
    """What one launch is: all that differs between a case's run and its reference's (or a
    calibration repeat's, the float64 oracle's, a PyTorch baseline's)."""
    name: str  # the LaunchSpec's case: the case's name, "reference", "baseline", ...
    model: str
    flags: dict  # what it is launched with, its own output paths included
    world_size: int
    checkpoint: Path
    input_bin: Path
    output_dir: Path
    gradients: bool  # dumped into output_dir/gradients
    port: bool  # given a rendezvous port (a case always; the others over one process only)
    launcher_processes: int = 0  # a case's per-group launch (Case.launcher_processes)

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise ValueError(f"a run target needs a name and a model: {self.name!r}, "
                             f"{self.model!r}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"{self.name}: world size {self.world_size!r}, expected a count "
                             f">= 1")

    def spec(self, device: str, slots: tuple[int, ...], port: int | None) -> LaunchSpec:
        return LaunchSpec(
            case=self.name, model=self.model, flags=dict(self.flags),
            world_size=self.world_size, checkpoint=self.checkpoint, input_bin=self.input_bin,
            output_dir=self.output_dir,
            gradients_dir=self.output_dir / "gradients" if self.gradients else None,
            log_dir=self.output_dir / "logs", device=device, port=port, slots=list(slots),
            launcher_processes=self.launcher_processes)


@dataclass(frozen=True)
class Leased:
    slots: tuple[int, ...]  # none under a scheduler: the job's devices are its own
    wait_s: float

    def __post_init__(self) -> None:
        if self.wait_s < 0:
            raise ValueError(f"a lease waited {self.wait_s} s")


@dataclass(frozen=True)
class Launched:
    spec: LaunchSpec
    result: ProcessResult
    rank_logs: dict[str, list[Path]]  # stdout before stderr
    leased: Leased
    # Nothing to check: spec and result are the launcher's own types (harness.launch), the
    # lease checked itself.


@dataclass(frozen=True)
class Ran:
    """A target through lease, port, launch and collect."""
    launched: Launched
    outputs: RunOutputs

    @property
    def failed(self) -> bool:
        return not self.launched.result.ok or bool(self.outputs.problem)


@contextmanager
def lease(leases, target: RunTarget) -> Iterator[Leased]:
    started = time.time()
    with leases.lease(target.world_size) as slots:
        yield Leased(tuple(slots), time.time() - started)


def port(settings, target: RunTarget) -> int | None:
    """Issued through the session's record (its folder `ports`), so no other run of the
    session gets it."""
    return free_port(settings.session_dir / "ports") if target.port else None


def launch(backend, target: RunTarget, leased: Leased, given_port: int | None,
           settings) -> Launched:
    """Slurm, local agents or the backend's own launch (harness.launch.placement)."""
    spec = target.spec(settings.device, leased.slots, given_port)
    result = launch_run(backend, spec, settings)
    return Launched(spec, result, rank_logs(backend, spec, result), leased)


def collect(backend, launched: Launched) -> Ran:
    return Ran(launched, backend.collect(launched.spec, launched.result))


def run(backend, target: RunTarget, settings, leases,
        on_lease: Callable[[Leased], None] | None = None) -> Ran:
    """lease -> port -> launch -> collect. `on_lease` hears of the lease before the launch,
    so a case whose launch raises still records the slots it held and its wait."""
    with lease(leases, target) as leased:
        if on_lease is not None:
            on_lease(leased)
        launched = launch(backend, target, leased, port(settings, target), settings)
    return collect(backend, launched)


def rank_logs(backend, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]:
    """Each rank's log files. A single process is launched without torchrun: its stdout
    and stderr (the launcher's files) are rank 0's logs."""
    logs = backend.rank_logs(spec, result)
    if not logs and spec.world_size == 1:
        logs = {"0": [p for p in (result.stdout, result.stderr) if p.is_file()]}
    # stdout before stderr: a failure's tail then ends with the traceback.
    return {rank: sorted(paths, key=lambda p: "stderr" in Path(p).name)
            for rank, paths in logs.items() if paths}


# ---------------------------------------------------------------------- a case's own stages


@dataclass(frozen=True)
class CasePlan:
    """The plan stage's answer: what the case runs and compares."""
    case: Case
    checkpoint: Path
    input_bin: Path
    relative: RelativeThresholds  # the scale-free thresholds (defaults or calibrated)
    calibration: dict  # the record's `calibration`: which thresholds, from where
    target: RunTarget  # the case's run: its folder, flags (output paths included), gradients
    record_flags: dict  # the flags less the run's own output paths (flags.run_private)
    gradients_note: dict | None  # `{compared: false, reason}` where gradients cannot be
    updates: str | None  # the flag that dumps parameter updates, when they are compared
    layout: dict | None  # the layout the flags ask for, until the run says which it used

    def __post_init__(self) -> None:
        if self.target.name != self.case.name:
            raise ValueError(f"a plan of {self.case.name} launches {self.target.name}")

    @property
    def out(self) -> Path:  # the case's run folder
        return self.target.output_dir

    @property
    def flags(self) -> dict:
        return self.target.flags

    @property
    def gradients(self) -> bool:  # dumped and compared (asked for, and comparable)
        return self.target.gradients


@dataclass(frozen=True)
class Referenced:
    entry: ReferenceEntry
    seconds: float  # a cache hit or a build

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ValueError(f"a reference got in {self.seconds} s")


@dataclass(frozen=True)
class Collected:
    """The case's reading of what its run left."""
    outputs: RunOutputs
    layout: dict | None  # the layout the run recorded, else the one the flags ask for
    failure: str | None  # the crash text when the run failed
    failing_rank: str | None = None
    environment: dict | None = None
    layout_text: str | None = None
    schedule: str | None = None  # the pipeline schedule the trainer chose and ran

    def __post_init__(self) -> None:
        if self.failing_rank is not None and self.failure is None:
            raise ValueError(f"rank {self.failing_rank} failed in a run with no failure")


@dataclass(frozen=True)
class Judged:
    verdict: CaseVerdict
    reference_steps: tuple[int, ...]  # from the run's first step on, as the verdict read them
    reference_losses: tuple
    summary: dict  # verdict.record(): the `loss` and `gradients` it judged

    def __post_init__(self) -> None:
        if len(self.reference_steps) != len(self.reference_losses):
            raise ValueError(f"{len(self.reference_steps)} reference steps, "
                             f"{len(self.reference_losses)} losses")


@dataclass(frozen=True)
class Settled:
    outcome: Outcome
    dumps: dict
    disk_bytes: int
    fp64_ratio: dict | None  # a calibration session's, with the bundled trainer

    def __post_init__(self) -> None:
        if self.disk_bytes < 0:
            raise ValueError(f"a run folder of {self.disk_bytes} bytes")


class Reached:
    """The stage results one case got to, in order; kept by CaseRunner.run alone (no stage
    sees it), so that a stage that raises leaves the record every stage before it gave."""

    def __init__(self, layout: dict | None) -> None:
        self.layout = layout  # the layout the flags ask for: even a skipped case has one
        self.plan: CasePlan | None = None
        self.reference: Referenced | None = None
        self.leased: Leased | None = None
        self.launched: Launched | None = None
        self.collected: Collected | None = None
        self.judged: Judged | None = None
        self.baseline: BaselineCheck | None = None
        self.compare_s: float | None = None
        self.trace: dict | None = None  # the module-level trace (harness.runner.trace)
        self.settled: Settled | None = None

    def keep_lease(self, leased: Leased) -> None:  # stages.run's on_lease
        self.leased = leased
