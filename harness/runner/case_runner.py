"""CaseRunner: one case end to end: files, reference (once per key), device lease, port, the
run, the diff, the result record.

The stages, named by verbs; each returns its own frozen result (harness.runner.stages), and the
record is assembled once, at the end, from the results of the stages the case reached
(harness.runner.record.assemble). A case goes through

    plan       CaseRunner.plan: skip reasons, model files, layout, thresholds, flags (CasePlan)
    reference  CaseRunner.reference: its golden record, cached entry or a build (Referenced)
    lease      stages.lease: device slots (Leased)
    port       stages.port: a rendezvous port
    launch     stages.launch: the processes (Launched)
    collect    stages.collect (Ran), then CaseRunner.collect: its layout, crash text (Collected)
    judge      CaseRunner.judge: the verdict against the reference (Judged)
    baseline   CaseRunner.baseline: the baseline check (BaselineCheck)
    settle     CaseRunner.settle: calibration, the dumps kept or removed, the outcome (Settled)

and its reference, when it is built, through

    plan       CaseRunner.plan_reference: the reference flags, process count, folder (RunTarget)
    lease, port, launch, collect      the same functions (stages.run), given that RunTarget
    judge      CaseRunner.judge_reference: can it be trusted
    settle     CaseRunner.settle_reference: its steps written, or its failure kept and raised

A calibration repeat (harness.runner.calibrate), the float64 oracle and the live PyTorch
baseline (harness.baseline.live, through run_one_device) run through the same lease, port,
launch and collect; what differs between all of them is their RunTarget."""

from __future__ import annotations

import math
import shlex
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Callable

from harness.baseline.gradients import GradientRequest
from harness.baseline.live import PYTORCH, BaselineCheck, LiveBaseline
from harness.baseline.recorded import recorded_check
from harness.cases import Case, HarnessConfig
from harness.compare import Locator
from harness.compare.case_verdict import UpdatesRequest
from harness.compare.case_verdict import judge as judge_runs
from harness.compare.diff import gradient_names
from harness.compare.dumps import folder_bytes, settle_dumps
from harness.compare.verdict import UPDATE_RESOLUTION, update_threshold
from harness.launch import LaunchSpec, ProcessResult
from harness.launch.backends import backend_factory
from harness.launch.multinode import case_leases, placed, placement_problem
from harness.reference import ReferenceCache, ReferenceEntry, ReferenceError, reference_key
from harness.reference.golden import (
    GoldenStore,
    environment_fingerprint,
    fingerprint_mismatch_text,
    mismatches,
)
from harness.contracts.flags import run_private
from harness.contracts.models import MODEL_SPECS
from harness.contracts.programs import PROGRAMS
from harness.contracts.records import read_jsonl, write_steps

from . import stages
from .calibrate import CalibrationError, measure, oracle_ratio, session_thresholds
from .checkpoints import (
    announce_checkpoint,
    mark_checkpoint_done,
    reroot_checkpoints,
    wait_for_checkpoint,
)
from .diagnosis import SELF_CHECK, crash_text, mismatch_text
from .planned_layout import layout_from_flags, layout_problem, num_layers
from .record import assemble, now
from .trace import Tracer, trace_lines
from .settings import Outcome, Settings
from .stages import (
    CasePlan,
    Collected,
    Judged,
    Launched,
    Ran,
    Reached,
    Referenced,
    RunTarget,
    Settled,
)


def make_backend(config: HarnessConfig, facts_dir: Path | None = None):
    """The trainer backend the config (or the command line) names, made by its registered
    factory (harness.registry); `facts_dir`: where a foreign binary's facts (flag
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


def kept_unknown(case: Case) -> str:
    """For a failed reference: the flags the table does not know that it kept (assumed
    mathematics), which may be why it failed, and how to declare them."""
    kept = [name for name in case.passthrough if name not in case.declared.roles]
    if not kept:
        return ""
    return (f"\nthe reference kept {', '.join('--' + n for n in kept)}: not in the flag table, "
            f"assumed mathematics; if a flag only places work, declare it: --harness-flag-role "
            f"{kept[0]}=topology (or the config's flag_roles)")


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
        first_step = trace_unavailable = trace_pairing = baseline_flags = \
        launch = command = environment = collect = rank_logs = failing_rank = \
        working_dir = _unavailable


class BackendUnavailable(RuntimeError):
    """Raised for every question asked of an UnavailableBackend; str() is the one line."""


def topology_text(topology: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in topology.items()) or "one device"


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
            if files.synthetic and model not in MODEL_SPECS:  # no synthetic assets to make
                program = PROGRAMS.get(model)
                names = (f"{program.checkpoint_variable} and {program.input_bin_variable}"
                         if program else "its model files")
                raise FileNotFoundError(
                    f"{self.config.path}: {model}: no model files: set {names} (the config's "
                    f"variables, or --harness-var NAME=PATH); the harness's synthetic assets "
                    f"hold no {model} model (they have {', '.join(MODEL_SPECS)})")
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
        A reference run drops the topology (the reference rule, harness.contracts.flags)."""
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
        if case.skip:  # known from the config alone (a program the harness has no facts for)
            return case.skip
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
        started, started_at = time.time(), now()
        # The layout the flags ask for, so skipped and crashed cases carry one too; a run that
        # records its own layout (run.json) replaces it.
        reached = Reached(layout_from_flags(case, self.num_layers(case.model)))
        try:
            outcome = self._run(case, reached)
        except BackendUnavailable as error:  # said once per case, as the trainer is named
            outcome = Outcome("error", f"{case.name}: {error}")
        except Exception as error:  # a harness-side problem: recorded, then shown
            outcome = Outcome("error", f"{case.name}: {type(error).__name__}: {error}")
        if self.foreign:  # a resume case waiting on this one must not wait for nothing
            mark_checkpoint_done(self.run_flags(case), ok=False, overwrite=False)
        outcome.record = assemble(case, self.settings, nodeid, self.backend.name, reached,
                                  outcome, started_at, time.time() - started).to_json()
        return outcome

    def _run(self, case: Case, reached: Reached) -> Outcome:
        """The case's stages in order (harness.runner.stages): plan -> reference -> lease ->
        port -> launch -> collect -> judge -> baseline -> settle. Each takes the results of the
        ones before it and returns its own, kept in `reached` for the record; a stage that ends
        the case returns its Outcome instead."""
        planned = self.plan(case, reached.layout)
        if isinstance(planned, Outcome):
            return planned
        reached.plan = planned
        reached.reference = reference = self.reference(case, planned.checkpoint,
                                                       planned.input_bin)
        waited = wait_for_checkpoint(planned.flags, self.settings.timeout_s)
        if waited:
            return Outcome("skipped", waited)
        ran = stages.run(self.backend, planned.target, self.settings, self.leases,
                         on_lease=reached.keep_lease)
        reached.launched = ran.launched
        reached.collected = collected = self.collect(planned, ran)
        if collected.failure is not None:
            if self.settings.baseline:
                reached.baseline = BaselineCheck(self.settings.baseline, "skipped",
                                                 reason="not run: the case's own run failed")
            return Outcome("failed", collected.failure)
        t = time.time()
        reached.judged = judged = self.judge(planned, collected, reference.entry)
        reached.baseline = self.baseline(planned, collected)
        reached.compare_s = time.time() - t
        reached.trace = Tracer(self).locate(planned, collected, judged, reached.baseline)
        reached.settled = settled = self.settle(planned, ran.launched, reference.entry,
                                                collected, judged, reached.baseline,
                                                reached.trace)
        return settled.outcome

    def plan(self, case: Case, layout: dict | None) -> CasePlan | Outcome:
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
            relative, calibration = session_thresholds(self, case)
        except CalibrationError as error:  # unreadable, or its noise is above the ceiling
            return Outcome("error", f"{case.name}: {error}")
        out = self.settings.session_dir / "cases" / case.tag / case.model / case.case_id
        flags = self.run_flags(case)
        no_gradients = self.gradients_unavailable(case.model, flags)
        if not no_gradients and case.reference_topology:
            reason = self.gradients_unavailable(case.model, self.run_flags(case, reference=True))
            no_gradients = f"the reference topology's gradients are {reason}" if reason else None
        updates = self.updates_flag(case, no_gradients)
        if updates:  # what the run ends with is compared too (docs/harness_guide.md)
            flags = {**flags, updates: str(out / "updates")}
        gradients = case.compare.gradients and not no_gradients
        return CasePlan(
            case, checkpoint, input_bin, relative, calibration,
            RunTarget(case.name, case.model, flags, case.world_size, checkpoint, input_bin, out,
                      gradients=gradients, port=True,
                      launcher_processes=case.launcher_processes),
            # What the run is launched with, less its own output paths (flags.run_private):
            # those are in output_dir and command, and would make every two records differ.
            record_flags={k: v for k, v in flags.items() if not run_private(k)},
            gradients_note={"compared": False, "reason": no_gradients}
            if case.compare.gradients and no_gradients else None,
            updates=updates, layout=layout)

    def collect(self, planned: CasePlan, ran: Ran) -> Collected:
        """The case's reading of what its run left: the layout and schedule it ran, its
        environment; the crash text and failing rank when it failed."""
        spec, result, outputs = ran.launched.spec, ran.launched.result, ran.outputs
        run_record = outputs.run_record or {}
        mark_checkpoint_done(planned.flags, not ran.failed)
        failure = failing = None
        if ran.failed:
            failing = self.backend.failing_rank(spec, result)
            if failing is None and spec.world_size == 1:
                failing = "0"  # one process: it is the one that failed
            failure = self._crash_text(planned.case, spec, result, failing,
                                       ran.launched.rank_logs, problem=outputs.problem)
        return Collected(outputs, run_record.get("layout") or planned.layout, failure, failing,
                         environment=run_record.get("environment"),
                         layout_text=run_record.get("layout_text"),
                         schedule=(run_record.get("parallel") or {}).get("schedule") or None)

    def judge(self, planned: CasePlan, collected: Collected,
              reference: ReferenceEntry) -> Judged:
        """The verdict (harness.compare.case_verdict) over what the case compares."""
        case, flags = planned.case, planned.flags
        ref_steps = read_jsonl(reference.steps_file)
        first = self.first_step(flags)
        ref_steps = [s for s in ref_steps if int(s["step"]) >= first]  # as compare_losses reads it
        gradients = case.compare.gradients and planned.gradients
        verdict = judge_runs(
            collected.outputs.steps, ref_steps if case.compare.loss else None,
            case.tolerances.loss, planned.relative.loss,
            (collected.outputs.gradients_dir, reference.gradients_dir) if gradients else None,
            case.tolerances.gradients, planned.relative.gradients,
            Locator.from_layout(collected.layout, case.model),
            tensor_parallel=self.backend.gradient_shards(flags),
            updates=UpdatesRequest(planned.out / "updates", reference.path / "updates",
                                   update_threshold(case.flags.get("dtype")), UPDATE_RESOLUTION)
            if planned.updates and gradients else None)
        return Judged(verdict, tuple(int(s["step"]) for s in ref_steps),
                      tuple(s.get("loss") for s in ref_steps), verdict.record())

    def baseline(self, planned: CasePlan, collected: Collected) -> BaselineCheck | None:
        """The baseline check (harness.baseline), kept apart from the self-check: against the
        bundled PyTorch trainer run live with the subject's semantics, or a recorded log."""
        given = self.settings.baseline
        if not given:
            return None
        case = planned.case
        if not self.foreign:
            return BaselineCheck(given, "skipped", reason="the bundled trainer is the PyTorch "
                                 "baseline itself; a baseline checks a foreign trainer")
        if given == PYTORCH:
            gradients, why_not = self.baseline_gradients(planned, collected)
            check = self.live_baseline().check(
                self.backend, case.model, case.name, case.args, collected.outputs.steps,
                planned.checkpoint, planned.input_bin, self.first_step(planned.flags),
                gradients, why_not)
            # step 1 module by module: part of the check (harness.runner.trace)
            return Tracer(self).baseline_module_check(planned, collected, check)
        return recorded_check(Path(given), case, collected.outputs.steps,
                              self.first_step(planned.flags))

    def live_baseline(self) -> LiveBaseline:
        """The PyTorch baseline's runner (made on first use, kept for the session)."""
        if self._live is None:
            self._live = LiveBaseline(self.settings, self.run_one_device, self.progress)
        return self._live

    def baseline_gradients(self, planned: CasePlan,
                           collected: Collected) -> tuple[GradientRequest | None, str | None]:
        """What of the case's gradients the live baseline compares: the run's dump with the
        self-check's thresholds, or why none (the reason the self-check gave, or a run that
        dumped none, which the self-check fails on its own)."""
        case = planned.case
        if not case.compare.gradients:
            return None, "the case compares no gradients"
        if not planned.gradients:
            note = planned.gradients_note or {}
            return None, note.get("reason") or "the case's run dumps no gradients"
        run_dir = collected.outputs.gradients_dir
        if run_dir is None or not gradient_names(run_dir):
            return None, f"the run dumped no gradients (none in {run_dir})"
        return GradientRequest(Path(run_dir), planned.out / "baseline-gradients",
                               case.tolerances.gradients, planned.relative.gradients,
                               self.backend.gradient_shards(planned.flags)), None

    def settle(self, planned: CasePlan, launched: Launched, reference: ReferenceEntry,
               collected: Collected, judged: Judged,
               baseline: BaselineCheck | None = None, trace: dict | None = None) -> Settled:
        """Calibration measurements, the dumps kept or removed, the outcome."""
        case, spec, verdict = planned.case, launched.spec, judged.verdict
        # before the dumps are settled: the fp64 ratio reads the run's gradients
        fp64, calibration_error = self._calibrate(planned, reference, collected, judged)
        dumps = settle_dumps(spec.gradients_dir, verdict.ok, self.settings.keep_dumps)
        if planned.updates:
            settle_dumps(planned.out / "updates", verdict.ok, self.settings.keep_dumps)
        settled = partial(Settled, dumps=dumps, disk_bytes=folder_bytes(spec.output_dir),
                          fp64_ratio=fp64)
        if calibration_error is not None:
            return settled(Outcome("error", f"{case.name}: {calibration_error}"))
        baseline_failed = baseline is not None and baseline.status in ("failed", "error")
        if verdict.ok and not baseline_failed:
            return settled(Outcome("passed", ""))
        # Both verdicts are said, each under its name: a parallelism bug (self-check red) and
        # an implementation bug (baseline red, self-check green) read apart.
        lines = ([] if verdict.ok else ["self-check (against its own single-device run): "
                                        "failed", *verdict.lines()])
        if baseline_failed:
            lines = ([] if not verdict.ok else ["self-check (against its own single-device "
                                                "run): passed"]) + lines + baseline.lines()
        # The header (the record's reason, the bisect's verdict line) names what it differs
        # from: a self-check that passed is not "differs from the single-device reference".
        lines += trace_lines(trace)
        against = (() if verdict.ok else (SELF_CHECK,)) + \
            ((f"the {baseline.source} baseline",) if baseline_failed else ())
        return settled(Outcome("failed", mismatch_text(case, lines, spec.output_dir,
                                                       reference.path, launched.result.argv,
                                                       against)))

    def _calibrate(self, planned: CasePlan, reference: ReferenceEntry, collected: Collected,
                   judged: Judged) -> tuple[dict | None, CalibrationError | None]:
        """--harness-calibrate (this machine's noise): the case's fp64 ratio (the bundled
        trainer's), its errors when it passed, the reference's repeats; the problem that makes
        the case an error, kept until its dumps are settled."""
        fp64 = None
        if not self.settings.calibrate_repeats:
            return fp64, None
        case = planned.case
        try:
            if not self.foreign:  # the float64 oracle's view
                fp64 = oracle_ratio(self, case, reference, planned.checkpoint, planned.input_bin,
                                    planned.out, collected.outputs.steps)
            measure(self, case, reference, planned.checkpoint, planned.input_bin,
                    judged.summary if judged.verdict.ok else None)
        except CalibrationError as error:
            return fp64, error
        return fp64, None

    # ------------------------------------------------------------------ the reference

    def run_target(self, target: RunTarget, backend=None) -> Ran:
        """A target other than a case's run (its reference, a calibration repeat, the float64
        oracle, a PyTorch baseline) through the case's own lease, port, launch and collect."""
        return stages.run(self.backend if backend is None else backend, target, self.settings,
                          self.leases)

    def run_one_device(self, backend, name: str, model: str, flags: dict, checkpoint: Path,
                       input_bin: Path, folder: Path, gradients: bool = False) -> Ran:
        """One process, no port, the first step's gradients when asked (LiveBaseline's runs)."""
        return self.run_target(RunTarget(name, model, flags, 1, checkpoint, input_bin, folder,
                                         gradients=gradients, port=False), backend)

    def plan_reference(self, case: Case, checkpoint: Path, input_bin: Path,
                       folder: Path) -> RunTarget:
        """The reference's run: the reference flags (its topology only, harness.contracts.flags),
        its process count, every gradient and parameter update dumped into `folder`; a port
        only over more than one process."""
        flags = self.run_flags(case, reference=True)
        updates = self.updates_flag(case)
        world = case.reference_world_size
        return RunTarget("reference", case.model,
                         {**flags, updates: str(folder / "updates")} if updates else flags,
                         world, checkpoint, input_bin, folder, gradients=True, port=world > 1)

    def reference(self, case: Case, checkpoint: Path, input_bin: Path) -> Referenced:
        """The case's reference: its golden record, the cached entry of its key, or a build
        (once per key: plan_reference -> lease -> port -> launch -> collect ->
        judge_reference -> settle_reference)."""
        started = time.time()
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
            return Referenced(self.golden(case, key), time.time() - started)
        name = self.references.entry_name(key)
        failure = self.settings.session_dir / "reference-failures" / f"{name}.txt"
        if failure.is_file():  # failed earlier in this session: do not run it again per case
            raise ReferenceError(failure.read_text())

        def build(folder: Path) -> dict:
            if self.progress is not None:  # the long silent part of a first session
                where = "one device" if world == 1 else topology_text(case.reference_topology)
                self.progress(f"building the reference of {case.name} ({where}; once per key, "
                              f"then cached in {self.references.root})")
            ran = self.run_target(self.plan_reference(case, checkpoint, input_bin, folder))
            problem = self.judge_reference(case, ran, flags, updates)
            return self.settle_reference(ran, problem, failure)

        entry = self.references.get_or_build(key, build)
        if self.settings.golden_write_dir is not None:
            GoldenStore(self.settings.golden_write_dir).write(key, entry, self.fingerprint())
        return Referenced(entry, time.time() - started)

    def judge_reference(self, case: Case, ran: Ran, flags: dict,
                        updates: str | None) -> str | None:
        """Why a reference build cannot be trusted (crashed, no steps, a non-finite loss, no
        gradients or updates where they were asked for), or None."""
        spec, result, outputs = ran.launched.spec, ran.launched.result, ran.outputs
        folder, world = spec.output_dir, spec.world_size
        if ran.failed:
            what = "reference" if world == 1 else \
                f"reference ({topology_text(case.reference_topology)})"
            return self._crash_text(case, spec, result, None, ran.launched.rank_logs,
                                    what=what, problem=outputs.problem) + kept_unknown(case)
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
    def settle_reference(ran: Ran, problem: str | None, failure: Path) -> dict:
        """A trusted build: its steps written for the cache, and what the cache entry keeps of
        it. An untrusted one: its failure text written for the session's later cases, then
        raised. The build's folder is deleted by the cache once this raises: its logs are kept
        beside the text, and the text points there."""
        folder, result = ran.launched.spec.output_dir, ran.launched.result
        if problem:
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
        if not (folder / "steps.jsonl").is_file():
            write_steps(folder / "steps.jsonl", ran.outputs.steps)
        return {"command": list(result.argv), "duration_s": result.duration_s}

    # ------------------------------------------------------------------ pieces

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

    def num_layers(self, model: str) -> int | None:
        checkpoint = self._files[model][0] if model in self._files else None
        return num_layers(self.config, model, checkpoint)

    def _crash_text(self, case: Case, spec: LaunchSpec, result: ProcessResult,
                    failing: str | None, rank_logs: dict, what: str = "run",
                    problem: str | None = None) -> str:
        return crash_text(case, spec, result, failing, rank_logs, self.settings.timeout_s, what,
                          problem)
