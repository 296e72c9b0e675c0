"""CaseRunner: one case end to end: files, reference (once per key), device lease, port, the
run, the diff, the result record."""

from __future__ import annotations

import math
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from harness.baseline.live import PYTORCH, BaselineCheck, LiveBaseline
from harness.baseline.recorded import recorded_check
from harness.cases import Case, HarnessConfig
from harness.compare import Locator
from harness.compare.case_verdict import CaseVerdict, UpdatesRequest, judge
from harness.compare.dumps import folder_bytes, settle_dumps
from harness.compare.verdict import UPDATE_RESOLUTION, RelativeThresholds, update_threshold
from harness.launch import (
    LaunchSpec,
    ProcessResult,
    RunOutputs,
    free_port,
)
from harness.launch.multinode import case_leases, placed, placement_problem
from harness.launch.placement import launch_run
from harness.launch.registry import backend_factory
from harness.reference import ReferenceCache, ReferenceError, reference_key
from harness.results.result_record import Logs, Reference, ResultRecord, Timings
from harness.reference.golden import (
    GoldenStore,
    environment_fingerprint,
    fingerprint_mismatch_text,
    mismatches,
)
from harness.spec.flags import run_private
from harness.spec.records import read_jsonl, write_steps

from .calibrate import CalibrationError, measure, session_thresholds
from .checkpoints import (
    announce_checkpoint,
    mark_checkpoint_done,
    reroot_checkpoints,
    wait_for_checkpoint,
)
from .diagnosis import SELF_CHECK, crash_text, mismatch_text
from .planned_layout import layout_from_flags, layout_problem, num_layers
from .record import now, set_layout, start_record, throughput
from .settings import Outcome, Settings


def make_backend(config: HarnessConfig, facts_dir: Path | None = None):
    """The trainer backend the config (or the command line) names, made by its registered
    factory (harness.launch.registry); `facts_dir`: where a foreign binary's facts (flag
    listing, CUDA or not) are kept, beside the reference cache."""
    return backend_factory(config.trainer.backend)(config, facts_dir)


def trainer_identity(config: HarnessConfig, device: str) -> dict:
    """The trainer under test as the session header and summary state it: its name, version
    (for InfiniTrain the build's content hash), build folder and device; never guessed."""
    spec = config.trainer
    identified = None  # InfiniTrain: how each binary was known (elf, script -> /path)
    try:
        backend = make_backend(config)
        version = backend.version()
        identified = backend.identities()
    except (OSError, ValueError):
        version = None  # an unusable build: each case says why
    build = str(spec.build_dir.resolve()) if spec.build_dir is not None else None
    return {"name": spec.backend, "version": version, "build_dir": build, "device": device,
            **({"identified": identified} if identified else {})}


class UnavailableBackend:
    """The configured trainer when it cannot be set up (a missing build folder): every case
    that reaches it is an error with that one line, and none is lost from the report. Every
    question of the TrainerBackend protocol is answered by raising BackendUnavailable."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem

    def _unavailable(self, *_args, **_kwargs):
        raise BackendUnavailable(self.problem)

    version = identities = unsupported = gradients_unavailable = gradient_shards = \
        first_step = baseline_flags = \
        launch = command = environment = collect = rank_logs = failing_rank = \
        working_dir = _unavailable


class BackendUnavailable(RuntimeError):
    """Raised for every question asked of an UnavailableBackend; str() is the one line."""


def topology_text(topology: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in topology.items()) or "one device"


@dataclass(frozen=True)
class CasePlan:
    """The plan stage's answer: what the case runs and compares."""
    case: Case
    checkpoint: Path
    input_bin: Path
    relative: RelativeThresholds  # the scale-free thresholds (defaults or calibrated)
    out: Path  # the case's run folder
    flags: dict  # what the run is launched with
    gradients: bool  # gradients dumped and compared (asked for, and comparable)
    updates: str | None  # the flag that dumps parameter updates, when they are compared


@dataclass(frozen=True)
class Launched:
    spec: LaunchSpec
    result: ProcessResult
    rank_logs: dict[str, list[Path]]


@dataclass(frozen=True)
class Collected:
    outputs: RunOutputs
    layout: dict | None  # the layout the run recorded, else the one the flags ask for
    failure: str | None  # the crash text when the run failed


class CaseRunner:
    def __init__(self, config: HarnessConfig, settings: Settings, backend=None) -> None:
        self.config = config
        self.settings = settings
        if backend is None:
            try:
                backend = make_backend(config, settings.reference_root / "binaries")
            except ValueError as error:  # InfiniTrainError, a bad command template
                backend = UnavailableBackend(config.trainer.backend, str(error))
        self.backend = backend
        self.references = ReferenceCache(settings.reference_root)
        # Local slot locks; none under a scheduler (harness.launch.multinode).
        self.leases = case_leases(settings)
        # Called with a line of text when something long starts (a reference build); the
        # plugin prints it where a terminal shows it.
        self.progress: Callable[[str], None] | None = None
        self._files: dict[str, tuple[Path, Path]] = {}
        self.calibrations: dict = {}  # dtype -> its CalibrationLookup (harness.runner.calibrate)
        self._live: LiveBaseline | None = None  # the PyTorch baseline, made on first use

    # ------------------------------------------------------------------ inputs

    def model_files(self, model: str) -> tuple[Path, Path]:
        if model not in self._files:
            files = self.config.files_for(model)
            if files.synthetic:
                from harness.assets import ensure_assets

                assets = ensure_assets(self.config.assets.preset, self.config.assets.dir,
                                       seed=self.config.assets.seed)
                self._files[model] = (assets.checkpoint(model), assets.tokens(model, "train"))
            else:
                for role, path in (("checkpoint", files.checkpoint),
                                   ("input_bin", files.input_bin)):
                    if not path.is_file():
                        where = f"model_files.{model}.{role}"
                        if files.variables:
                            name = files.variables[0 if role == "checkpoint" else 1]
                            where = (f"variable {name} (set it with --harness-var "
                                     f"{name}=PATH)")
                        raise FileNotFoundError(f"{self.config.path}: {where}: {path} does "
                                                f"not exist")
                self._files[model] = (files.checkpoint, files.input_bin)
        return self._files[model]

    def announce(self, case: Case) -> None:
        """Before any case runs: say which checkpoints this session's cases will save."""
        if self.foreign:
            announce_checkpoint(self.run_flags(case))

    @property
    def foreign(self) -> bool:
        """A trainer other than the bundled one: launched with the case's flags as written."""
        return self.backend.name != "harness"

    def run_flags(self, case: Case, reference: bool = False) -> dict:
        """The flags a run is launched with: the bundled trainer gets its resolved flags; a
        foreign trainer the case's flags as written, checkpoint paths moved under the session.
        A reference run drops the topology (the reference rule, harness.spec.flags)."""
        topology = case.reference_topology if reference else {}
        if not self.foreign:
            if not reference:
                return dict(case.flags)
            # data_parallel is a process count, not a flag of the bundled trainer
            return {**case.reference_flags(),
                    **{k: v for k, v in topology.items() if k != "data_parallel"}}
        args = {**case.reference_args(), **topology} if reference else dict(case.args)
        return reroot_checkpoints(args, self.settings.session_dir / "checkpoints" / case.model)

    def skip_reason(self, case: Case) -> str | None:
        if case.unsupported and not self.foreign:
            return (f"uses flag(s) {', '.join(case.unsupported)} that the harness trainer "
                    f"does not implement")
        # What this build cannot run at all comes before the device count: it would not run
        # whatever --gpus says.
        reason = self.backend.unsupported(case.model, self.run_flags(case), case.world_size)
        if reason:
            return reason
        if case.reference_world_size > 1:
            reason = self.backend.unsupported(case.model, self.run_flags(case, reference=True),
                                              case.reference_world_size)
            if reason:
                return f"its reference topology: {reason}"
        if placed(self.settings):  # over nodes or on a scheduler (harness.launch.multinode)
            return (placement_problem(case.world_size, self.settings, self.foreign)
                    or placement_problem(case.reference_world_size, self.settings, self.foreign,
                                         "its reference topology"))
        if case.world_size > self.settings.slots:
            return (f"needs {case.world_size} devices (dp {case.dp} x tp {case.tp} x pp "
                    f"{case.pp}), but --gpus allows {self.settings.slots}")
        if case.reference_world_size > self.settings.slots:
            return (f"its reference topology ({topology_text(case.reference_topology)}) needs "
                    f"{case.reference_world_size} devices, but --gpus allows "
                    f"{self.settings.slots}")
        return None

    # ------------------------------------------------------------------ the case

    def run(self, case: Case, nodeid: str = "") -> Outcome:
        started = time.time()
        record = start_record(case, self.settings, nodeid)
        record.trainer = self.backend.name
        # The layout the flags ask for, so skipped and crashed cases carry one too; a run that
        # records its own layout (run.json) replaces it below.
        set_layout(record, layout_from_flags(case, self.num_layers(case.model)))
        timings = record.timings
        try:
            outcome = self._run(case, record, timings)
        except BackendUnavailable as error:  # said once per case, as the trainer is named
            outcome = Outcome("error", f"{case.name}: {error}")
        except Exception as error:  # a harness-side problem: recorded, then shown
            outcome = Outcome("error", f"{case.name}: {type(error).__name__}: {error}")
        if self.foreign:  # a resume case waiting on this one must not wait for nothing
            mark_checkpoint_done(self.run_flags(case), ok=False, overwrite=False)
        record.status = outcome.status
        record.reason = outcome.message.splitlines()[0] if outcome.message else None
        if outcome.status in ("failed", "error"):
            record.errors.append(outcome.message)
        timings.total_s = time.time() - started
        record.finished_at = now()
        outcome.record = record.to_json()
        return outcome

    def _run(self, case: Case, record: ResultRecord, timings: Timings) -> Outcome:
        """The case's stages in order: plan -> reference -> launch -> collect -> judge ->
        settle. Each stage takes the ones before it and fills its part of the record; a stage
        that ends the case returns its Outcome instead."""
        planned = self.plan(case, record)
        if isinstance(planned, Outcome):
            return planned
        t = time.time()
        reference = self.reference(case, planned.checkpoint, planned.input_bin)
        timings.reference_s = time.time() - t
        record.reference = Reference(key=reference.key, path=str(reference.path),
                                     built=reference.built,
                                     command=reference.info.get("command"),
                                     topology=dict(case.reference_topology) or None,
                                     golden=reference.info.get("golden"),
                                     golden_mismatch=reference.info.get("mismatch"))
        waited = wait_for_checkpoint(planned.flags, self.settings.timeout_s)
        if waited:
            return Outcome("skipped", waited)
        launched = self.launch_case(planned, record, timings)
        collected = self.collect_case(planned, launched, record)
        if collected.failure is not None:
            if self.settings.baseline:
                record.baseline = BaselineCheck(
                    self.settings.baseline, "skipped",
                    reason="not run: the case's own run failed").record()
            record.self_check = "failed"
            return Outcome("failed", collected.failure)
        t = time.time()
        verdict = self.judge_case(planned, collected, reference, record)
        record.self_check = "passed" if verdict.ok else "failed"
        baseline = self.baseline_case(planned, collected, record)
        timings.compare_s = time.time() - t
        return self.settle(planned, launched, reference, verdict, record, baseline)

    def plan(self, case: Case, record: ResultRecord) -> "CasePlan | Outcome":
        """What the case will run, or why it will not: skip reasons, the model files, the
        layout (a layout that cannot place the model's layers is the config's error, found
        before anything launches: launched, it would read as a crash, a regression), the
        thresholds, the flags and which outputs are compared."""
        reason = self.skip_reason(case)
        if reason:
            return Outcome("skipped", reason)
        checkpoint, input_bin = self.model_files(case.model)
        problem = layout_problem(case, self.num_layers(case.model))
        if problem:
            return Outcome("error", problem)
        try:  # the scale-free thresholds: the defaults, or this machine's calibration
            relative, record.calibration = session_thresholds(self, case)
        except CalibrationError as error:  # unreadable, or its noise is above the ceiling
            return Outcome("error", f"{case.name}: {error}")
        out = self.settings.session_dir / "cases" / case.tag / case.model / case.case_id
        flags = self.run_flags(case)
        no_gradients = self.gradients_unavailable(case.model, flags)
        if not no_gradients and case.reference_topology:
            reason = self.gradients_unavailable(case.model, self.run_flags(case, reference=True))
            no_gradients = f"the reference topology's gradients are {reason}" if reason else None
        if case.compare.gradients and no_gradients:
            record.gradients = {"compared": False, "reason": no_gradients}
        updates = self.updates_flag(case, no_gradients)
        if updates:  # what the run ends with is compared too (docs/harness_guide.md)
            flags = {**flags, updates: str(out / "updates")}
        # What the run is launched with, less its own output paths (flags.run_private): those
        # are in output_dir and command, and would make every two records differ.
        record.flags = {k: v for k, v in flags.items() if not run_private(k)}
        record.output_dir = str(out)
        return CasePlan(case, checkpoint, input_bin, relative, out, flags,
                        gradients=case.compare.gradients and not no_gradients,
                        updates=updates)

    def launch_case(self, planned: "CasePlan", record: ResultRecord,
                    timings: Timings) -> "Launched":
        """Lease the devices, launch, record how it went."""
        case, out = planned.case, planned.out
        spec = LaunchSpec(
            case=case.name, model=case.model, flags=planned.flags, world_size=case.world_size,
            checkpoint=planned.checkpoint, input_bin=planned.input_bin, output_dir=out,
            gradients_dir=(out / "gradients") if planned.gradients else None,
            log_dir=out / "logs", device=self.settings.device,
        )
        t = time.time()
        with self.leases.lease(case.world_size) as slots:
            timings.lease_wait_s = time.time() - t
            spec.slots = slots
            spec.port = free_port(self.settings.session_dir / "ports")
            record.devices = slots or None  # none under a scheduler: the job's are unknown
            result = self._launch(spec)
        timings.run_s = result.run_s
        if result.job is not None:
            timings.queue_s = result.job.queue_s
            record.job = asdict(result.job)
        record.command = list(result.argv)
        record.returncode, record.timed_out = result.returncode, result.timed_out
        rank_logs = self._rank_logs(spec, result)
        record.logs = Logs(launcher_stdout=str(result.stdout), launcher_stderr=str(result.stderr),
                           ranks={r: [str(p) for p in ps] for r, ps in rank_logs.items()})
        return Launched(spec, result, rank_logs)

    def collect_case(self, planned: "CasePlan", launched: "Launched",
                     record: ResultRecord) -> "Collected":
        """What the run left: steps, layout, run record; the crash text when it failed."""
        spec, result = launched.spec, launched.result
        outputs = self.backend.collect(spec, result)
        run_record = outputs.run_record or {}
        record.environment = run_record.get("environment")
        layout = run_record.get("layout") or record.layout
        set_layout(record, layout)
        record.layout_text = run_record.get("layout_text")
        ran = run_record.get("parallel") or {}
        if ran.get("schedule") and record.parallel is not None:
            record.parallel.schedule = ran["schedule"]  # what the trainer chose and ran
        steps = outputs.steps
        record.losses = [s.get("loss") for s in steps]
        record.steps = [int(s["step"]) for s in steps]
        record.set(**throughput(steps))
        mark_checkpoint_done(planned.flags, result.ok and not outputs.problem)
        failure = None
        if not result.ok or outputs.problem:
            failing = self.backend.failing_rank(spec, result)
            if failing is None and spec.world_size == 1:
                failing = "0"  # one process: it is the one that failed
            record.failing_rank = failing
            failure = self._crash_text(planned.case, spec, result, failing, launched.rank_logs,
                                       problem=outputs.problem)
        return Collected(outputs, layout, failure)

    def judge_case(self, planned: "CasePlan", collected: "Collected", reference,
                   record: ResultRecord) -> CaseVerdict:
        """The verdict (harness.compare.case_verdict) over what the case compares."""
        case, flags = planned.case, planned.flags
        ref_steps = read_jsonl(reference.steps_file)
        first = self.first_step(flags)
        ref_steps = [s for s in ref_steps if int(s["step"]) >= first]  # as compare_losses reads it
        record.reference_losses = [s.get("loss") for s in ref_steps]
        record.reference_steps = [int(s["step"]) for s in ref_steps]
        gradients = case.compare.gradients and planned.gradients
        verdict = judge(
            collected.outputs.steps, ref_steps if case.compare.loss else None,
            case.tolerances.loss, planned.relative.loss,
            (collected.outputs.gradients_dir, reference.gradients_dir) if gradients else None,
            case.tolerances.gradients, planned.relative.gradients,
            Locator.from_layout(collected.layout, case.model),
            tensor_parallel=self.backend.gradient_shards(flags),
            updates=UpdatesRequest(planned.out / "updates", reference.path / "updates",
                                   update_threshold(case.flags.get("dtype")), UPDATE_RESOLUTION)
            if planned.updates and gradients else None)
        judged = verdict.record()
        record.loss = judged.get("loss", record.loss)
        record.gradients = judged.get("gradients", record.gradients)  # or why none were compared
        return verdict

    def baseline_case(self, planned: "CasePlan", collected: "Collected",
                      record: ResultRecord) -> BaselineCheck | None:
        """The baseline check (harness.baseline), kept apart from the self-check: against the
        bundled PyTorch trainer run live with the subject's semantics, or a recorded log."""
        given = self.settings.baseline
        if not given:
            return None
        case = planned.case
        if not self.foreign:
            check = BaselineCheck(given, "skipped", reason="the bundled trainer is the PyTorch "
                                  "baseline itself; a baseline checks a foreign trainer")
        elif given == PYTORCH:
            if self._live is None:
                self._live = LiveBaseline(
                    self.settings, self.leases,
                    lambda backend, spec: launch_run(backend, spec, self.settings),
                    self.progress)
            check = self._live.check(self.backend, case.model, case.name, case.args,
                                     collected.outputs.steps, planned.checkpoint,
                                     planned.input_bin, self.first_step(planned.flags))
        else:
            check = recorded_check(Path(given), case, collected.outputs.steps,
                                   self.first_step(planned.flags))
        record.baseline = check.record()
        return check

    def settle(self, planned: "CasePlan", launched: "Launched", reference,
               verdict: CaseVerdict, record: ResultRecord,
               baseline: BaselineCheck | None = None) -> Outcome:
        """Calibration measurements, the dumps kept or removed, the outcome."""
        case, spec = planned.case, launched.spec
        calibration_error = None
        if self.settings.calibrate_repeats:  # --harness-calibrate: this machine's noise
            try:  # before the dumps are settled: the fp64 ratio reads the run's gradients
                measure(self, case, record, reference, planned.checkpoint, planned.input_bin,
                        passed=verdict.ok)
            except CalibrationError as error:
                calibration_error = error
        record.dumps = settle_dumps(spec.gradients_dir, verdict.ok, self.settings.keep_dumps)
        if planned.updates:
            settle_dumps(planned.out / "updates", verdict.ok, self.settings.keep_dumps)
        record.disk_bytes = folder_bytes(spec.output_dir)
        if calibration_error is not None:
            return Outcome("error", f"{case.name}: {calibration_error}")
        baseline_failed = baseline is not None and baseline.status in ("failed", "error")
        if verdict.ok and not baseline_failed:
            return Outcome("passed", "")
        # Both verdicts are said, each under its name: a parallelism bug (self-check red) and
        # an implementation bug (baseline red, self-check green) read apart.
        lines = ([] if verdict.ok else ["self-check (against its own single-device run): "
                                        "failed", *verdict.lines()])
        if baseline_failed:
            lines = ([] if not verdict.ok else ["self-check (against its own single-device "
                                                "run): passed"]) + lines + baseline.lines()
        # The header (the record's reason, the bisect's verdict line) names what it differs
        # from: a self-check that passed is not "differs from the single-device reference".
        against = (() if verdict.ok else (SELF_CHECK,)) + \
            ((f"the {baseline.source} baseline",) if baseline_failed else ())
        return Outcome("failed", mismatch_text(case, lines, spec.output_dir,
                                               reference.path, launched.result.argv, against))

    # ------------------------------------------------------------------ pieces

    def _launch(self, spec: LaunchSpec) -> ProcessResult:
        return launch_run(self.backend, spec, self.settings)  # Slurm, local agents or local

    def updates_flag(self, case: Case, no_gradients: str | None = None) -> str | None:
        """The flag that makes the bundled trainer dump every parameter's change over the run
        (compared like gradients) where gradients are compared; None for other trainers."""
        if self.foreign or not case.compare.gradients or no_gradients:
            return None
        return "dump_parameter_updates"

    def gradients_unavailable(self, model: str, flags: dict) -> str | None:
        """Why this trainer cannot give comparable gradients for these flags, or None."""
        return self.backend.gradients_unavailable(model, flags)

    def first_step(self, flags: dict) -> int:
        return self.backend.first_step(flags)

    def reference(self, case: Case, checkpoint: Path, input_bin: Path):
        flags = self.run_flags(case, reference=True)
        world = case.reference_world_size
        # The process count is part of a trusted topology (dp is no flag of the bundled trainer).
        key_flags = flags if world == 1 else {**flags, "reference_world_size": world}
        updates = self.updates_flag(case)
        if updates:  # an entry built before parameter updates were dumped is not reused
            key_flags = {**key_flags, updates: "<entry>/updates"}
        key = reference_key(case.model, {"checkpoint": checkpoint, "input_bin": input_bin},
                            key_flags, self.settings.device, self.backend.version())
        if self.settings.golden_dir is not None:
            return self.golden(case, key)
        name = self.references.entry_name(key)
        failure = self.settings.session_dir / "reference-failures" / f"{name}.txt"
        if failure.is_file():  # failed earlier in this session: do not run it again per case
            raise ReferenceError(failure.read_text())

        def build(folder: Path) -> dict:
            if self.progress is not None:  # the long silent part of a first session
                where = "one device" if world == 1 else topology_text(case.reference_topology)
                self.progress(f"building the reference of {case.name} ({where}; once per key, "
                              f"then cached in {self.references.root})")
            launched = {**flags, updates: str(folder / "updates")} if updates else flags
            spec = LaunchSpec(case="reference", model=case.model, flags=launched, world_size=world,
                              checkpoint=checkpoint, input_bin=input_bin, output_dir=folder,
                              gradients_dir=folder / "gradients", log_dir=folder / "logs",
                              device=self.settings.device)
            with self.leases.lease(world) as slots:
                spec.slots = slots
                if world > 1:
                    spec.port = free_port(self.settings.session_dir / "ports")
                result = self._launch(spec)
                outputs = self.backend.collect(spec, result)
            problem = self._reference_problem(case, spec, result, outputs, flags, updates)
            if problem:
                self._keep_reference_failure(failure, folder, problem, result)
            if not (folder / "steps.jsonl").is_file():
                write_steps(folder / "steps.jsonl", outputs.steps)
            return {"command": list(result.argv), "duration_s": result.duration_s}

        entry = self.references.get_or_build(key, build)
        if self.settings.golden_write_dir is not None:
            GoldenStore(self.settings.golden_write_dir).write(key, entry, self.fingerprint())
        return entry

    def _reference_problem(self, case: Case, spec: LaunchSpec, result: ProcessResult,
                           outputs: RunOutputs, flags: dict, updates: str | None) -> str | None:
        """Why a reference build cannot be trusted (crashed, no steps, a non-finite loss, no
        gradients or updates where they were asked for), or None."""
        folder, world = spec.output_dir, spec.world_size
        if not result.ok or outputs.problem:
            what = "reference" if world == 1 else \
                f"reference ({topology_text(case.reference_topology)})"
            return self._crash_text(case, spec, result, None, self._rank_logs(spec, result),
                                    what=what, problem=outputs.problem)
        if not outputs.steps:
            return f"the reference run of {case.model} recorded no steps"
        if not all(math.isfinite(float(s["loss"])) for s in outputs.steps):
            return f"the reference run of {case.model} has a non-finite loss"
        if not self.gradients_unavailable(case.model, flags) and \
                not list((folder / "gradients").glob("*.npy")):
            return f"the reference run of {case.model} dumped no gradients"
        if updates and not list((folder / "updates").glob("*.npy")):
            return f"the reference run of {case.model} dumped no parameter updates (--{updates})"
        return None

    @staticmethod
    def _keep_reference_failure(failure: Path, folder: Path, problem: str,
                                result: ProcessResult) -> None:
        """Write the failure text for the session's later cases and raise it. The build's
        folder is deleted by the cache once this raises: its logs are kept beside the text,
        and the text points there."""
        if "command:" not in problem:
            problem += f"\ncommand: {shlex.join(result.argv)}\nlog: {result.stdout}"
        kept = failure.with_suffix("")
        failure.parent.mkdir(parents=True, exist_ok=True)
        if (folder / "logs").is_dir():
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(folder / "logs", kept / "logs")
        problem = problem.replace(str(folder), str(kept))
        failure.write_text(problem)
        raise ReferenceError(problem)

    def fingerprint(self) -> dict:
        return environment_fingerprint(self.backend.version(), self.settings.device,
                                       torch_matters=not self.foreign)

    def golden(self, case: Case, key: dict):
        """The golden record of the case's reference, checked against this environment."""
        golden = GoldenStore(self.settings.golden_dir).read(key, case.name)
        found = mismatches(golden.fingerprint, self.fingerprint())
        if found and not self.settings.golden_allow_mismatch:
            raise ReferenceError(
                f"{case.name}: the golden record {golden.entry.path} was made in another "
                f"environment: {fingerprint_mismatch_text(found)} (re-record it with --harness-golden-write, "
                f"or accept it with --harness-golden-allow-mismatch)")
        golden.entry.info["mismatch"] = {k: list(v) for k, v in found.items()} or None
        return golden.entry

    def _rank_logs(self, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]:
        """Each rank's log files. A single process is launched without torchrun: its stdout
        and stderr (the launcher's files) are rank 0's logs."""
        logs = self.backend.rank_logs(spec, result)
        if not logs and spec.world_size == 1:
            logs = {"0": [p for p in (result.stdout, result.stderr) if p.is_file()]}
        # stdout before stderr: a failure's tail then ends with the traceback.
        return {rank: sorted(paths, key=lambda p: "stderr" in Path(p).name)
                for rank, paths in logs.items() if paths}

    def num_layers(self, model: str) -> int | None:
        checkpoint = self._files[model][0] if model in self._files else None
        return num_layers(self.config, model, checkpoint)

    def _crash_text(self, case: Case, spec: LaunchSpec, result: ProcessResult,
                    failing: str | None, rank_logs: dict, what: str = "run",
                    problem: str | None = None) -> str:
        return crash_text(case, spec, result, failing, rank_logs, self.settings.timeout_s, what,
                          problem)
