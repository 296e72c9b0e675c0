"""CaseRunner: one case end to end: files, reference (once per key), device lease, port, the
run, the diff, the result record."""

from __future__ import annotations

import math
import shlex
import time
from pathlib import Path

from harness.cases import Case, HarnessConfig
from harness.compare import Locator, compare_gradients, compare_losses, gradient_lines, loss_lines
from harness.launch import (
    CommandBackend,
    DeviceLeases,
    HarnessBackend,
    LaunchSpec,
    ProcessResult,
    free_port,
    run_process,
)
from harness.launch.backends import read_jsonl
from harness.reference import ReferenceCache, ReferenceError, reference_key

from .diagnosis import crash_text, mismatch_text
from .planned_layout import layout_from_flags, num_layers
from .record import now, set_layout, start_record, throughput
from .settings import Outcome, Settings
from .steps_file import write_steps


def make_backend(config: HarnessConfig):
    spec = config.trainer
    if spec.backend == "command":
        return CommandBackend(spec.command, version=spec.version, env=dict(spec.env),
                              base_dir=config.path.parent)
    return HarnessBackend(env=dict(spec.env))


class CaseRunner:
    def __init__(self, config: HarnessConfig, settings: Settings, backend=None) -> None:
        self.config = config
        self.settings = settings
        self.backend = backend if backend is not None else make_backend(config)
        self.references = ReferenceCache(settings.reference_root)
        self.leases = DeviceLeases(settings.lease_dir, settings.slots)
        self._files: dict[str, tuple[Path, Path]] = {}

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
                for path in (files.checkpoint, files.input_bin):
                    if not path.is_file():
                        raise FileNotFoundError(f"{self.config.path}: model_files.{model}: "
                                                f"{path} does not exist")
                self._files[model] = (files.checkpoint, files.input_bin)
        return self._files[model]

    def skip_reason(self, case: Case) -> str | None:
        if case.unsupported and self.backend.name == "harness":
            return (f"uses InfiniTrain flag(s) {', '.join(case.unsupported)} that the harness "
                    f"trainer does not implement")
        if case.world_size > self.settings.slots:
            return (f"needs {case.world_size} devices (dp {case.dp} x tp {case.tp} x pp "
                    f"{case.pp}), but --gpus allows {self.settings.slots}")
        return None

    # ------------------------------------------------------------------ the case

    def run(self, case: Case, nodeid: str = "") -> Outcome:
        started = time.time()
        record = start_record(case, self.settings, nodeid)
        # The layout the flags ask for, so skipped and crashed cases carry one too; a run that
        # records its own layout (run.json) replaces it below.
        set_layout(record, layout_from_flags(case, self.num_layers(case.model)))
        timings: dict[str, float] = {}
        record["timings"] = timings
        try:
            outcome = self._run(case, record, timings)
        except Exception as error:  # a harness-side problem: recorded, then shown
            outcome = Outcome("error", f"{case.name}: {type(error).__name__}: {error}")
        record["status"] = outcome.status
        record["reason"] = outcome.message.splitlines()[0] if outcome.message else None
        if outcome.status in ("failed", "error"):
            record["errors"].append(outcome.message)
        timings["total_s"] = time.time() - started
        record["finished_at"] = now()
        outcome.record = record
        return outcome

    def _run(self, case: Case, record: dict, timings: dict) -> Outcome:
        reason = self.skip_reason(case)
        if reason:
            return Outcome("skipped", reason)
        checkpoint, input_bin = self.model_files(case.model)

        t = time.time()
        reference = self.reference(case, checkpoint, input_bin)
        timings["reference_s"] = time.time() - t
        record["reference"] = {"key": reference.key, "path": str(reference.path),
                               "built": reference.built, "command": reference.info.get("command")}

        out = self.settings.session_dir / "cases" / case.tag / case.model / case.case_id
        flags = dict(case.flags)
        if self.backend.name != "harness":
            flags.update(case.extra_flags)
        spec = LaunchSpec(
            case=case.name, model=case.model, flags=flags, world_size=case.world_size,
            checkpoint=checkpoint, input_bin=input_bin, output_dir=out,
            gradients_dir=(out / "gradients") if case.compare.gradients else None,
            log_dir=out / "logs", device=self.settings.device,
        )
        record["output_dir"] = str(out)
        t = time.time()
        with self.leases.lease(case.world_size) as slots:
            timings["lease_wait_s"] = time.time() - t
            spec.slots = slots
            spec.port = free_port(self.settings.session_dir / "ports")
            record["devices"] = slots
            result = self._launch(spec)
        timings["run_s"] = result.duration_s
        record.update(command=list(result.argv), returncode=result.returncode,
                      timed_out=result.timed_out)
        rank_logs = self._rank_logs(spec, result)
        record["logs"] = {"launcher_stdout": str(result.stdout),
                          "launcher_stderr": str(result.stderr),
                          "ranks": {r: [str(p) for p in ps] for r, ps in rank_logs.items()}}
        outputs = self.backend.collect(spec, result)
        run_record = outputs.run_record or {}
        record["environment"] = run_record.get("environment")
        layout = run_record.get("layout") or record["layout"]
        set_layout(record, layout)
        record["layout_text"] = run_record.get("layout_text")
        ran = run_record.get("parallel") or {}
        if ran.get("schedule") and isinstance(record.get("parallel"), dict):
            record["parallel"]["schedule"] = ran["schedule"]  # what the trainer chose and ran
        steps = outputs.steps
        record["losses"] = [s.get("loss") for s in steps]
        record.update(throughput(steps))

        if not result.ok:
            failing = self.backend.failing_rank(spec, result)
            if failing is None and spec.world_size == 1:
                failing = "0"  # one process: it is the one that failed
            record["failing_rank"] = failing
            return Outcome("failed", self._crash_text(case, spec, result, failing, rank_logs))

        t = time.time()
        lines = []
        ok = True
        ref_steps = read_jsonl(reference.steps_file)
        record["reference_losses"] = [s.get("loss") for s in ref_steps]
        if case.compare.loss:
            loss = compare_losses(steps, ref_steps, case.tolerances.loss)
            record["loss"] = loss.to_dict()
            ok &= loss.ok
            lines += loss_lines(loss)
        if case.compare.gradients:
            grads = compare_gradients(outputs.gradients_dir, reference.gradients_dir,
                                      case.tolerances.gradients,
                                      Locator.from_layout(layout, case.model))
            record["gradients"] = grads.to_dict()
            ok &= grads.ok
            lines += gradient_lines(grads)
        timings["compare_s"] = time.time() - t
        if ok:
            return Outcome("passed", "")
        return Outcome("failed", mismatch_text(case, lines, spec.output_dir, reference.path,
                                               result.argv))

    # ------------------------------------------------------------------ pieces

    def _launch(self, spec: LaunchSpec) -> ProcessResult:
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        launch = getattr(self.backend, "launch", None)  # a backend that launches itself
        if launch is not None:
            return launch(spec, self.settings)
        return run_process(self.backend.command(spec), self.backend.environment(spec),
                           self.settings.timeout_s, spec.log_dir / "launcher.stdout",
                           spec.log_dir / "launcher.stderr")

    def reference(self, case: Case, checkpoint: Path, input_bin: Path):
        flags = case.reference_flags()
        key = reference_key(case.model, {"checkpoint": checkpoint, "input_bin": input_bin}, flags,
                            self.settings.device, self.backend.version())
        name = self.references.entry_name(key)
        failure = self.settings.session_dir / "reference-failures" / f"{name}.txt"
        if failure.is_file():  # failed earlier in this session: do not run it again per case
            raise ReferenceError(failure.read_text())

        def build(folder: Path) -> dict:
            spec = LaunchSpec(case="reference", model=case.model, flags=flags, world_size=1,
                              checkpoint=checkpoint, input_bin=input_bin, output_dir=folder,
                              gradients_dir=folder / "gradients", log_dir=folder / "logs",
                              device=self.settings.device)
            with self.leases.lease(1) as slots:
                spec.slots = slots
                result = self._launch(spec)
            outputs = self.backend.collect(spec, result)
            problem = None
            if not result.ok:
                problem = self._crash_text(case, spec, result, None,
                                           self._rank_logs(spec, result), what="reference")
            elif not outputs.steps:
                problem = f"the reference run of {case.model} recorded no steps"
            elif not all(math.isfinite(float(s["loss"])) for s in outputs.steps):
                problem = f"the reference run of {case.model} has a non-finite loss"
            elif not list((folder / "gradients").glob("*.npy")):
                problem = f"the reference run of {case.model} dumped no gradients"
            if problem:
                if "command:" not in problem:
                    problem += f"\ncommand: {shlex.join(result.argv)}\nlog: {result.stdout}"
                failure.parent.mkdir(parents=True, exist_ok=True)
                failure.write_text(problem)
                raise ReferenceError(problem)
            if not (folder / "steps.jsonl").is_file():
                write_steps(folder / "steps.jsonl", outputs.steps)
            return {"command": list(result.argv), "duration_s": result.duration_s}

        return self.references.get_or_build(key, build)

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
                    failing: str | None, rank_logs: dict, what: str = "run") -> str:
        return crash_text(case, spec, result, failing, rank_logs, self.settings.timeout_s, what)
