"""Run one case end to end: files, reference (once per key), device lease, port, the run, the
diff, the result record. Plain Python (no pytest): the plugin's items call `CaseRunner.run` and
turn its Outcome into pass / fail / skip.

Per case, under the session folder:

    cases/<tag>/<model>/<id>/       the run's --output_dir (run.json, steps.jsonl, layout.txt)
        gradients/                  its gradient dump
        logs/launcher.stdout|stderr, logs/ranks/...   launcher and per-rank logs
"""

from __future__ import annotations

import math
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    tail,
)
from harness.reference import ReferenceCache, ReferenceError, reference_key
from harness.results import new_record

TAIL_LINES = 25


@dataclass(frozen=True)
class Settings:
    session_id: str
    session_dir: Path
    reference_root: Path
    lease_dir: Path
    slots: int  # devices the run may use (--gpus)
    device: str  # cpu | cuda
    timeout_s: float
    worker: str = "main"


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | error
    message: str  # the failure / skip text shown by pytest
    record: dict = field(default_factory=dict)


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
        record = new_record(
            session=self.settings.session_id, worker=self.settings.worker, nodeid=nodeid,
            name=case.name, tag=case.tag, model=case.model, case_id=case.case_id,
            description=case.description, world_size=case.world_size,
            parallel={"pp": case.pp, "tp": case.tp, "dp": case.dp, "vpp": case.vpp,
                      "sequence_parallel": bool(case.flags.get("sequence_parallel"))},
            flags={**case.flags, **case.extra_flags}, device=self.settings.device,
            compare=case.compare.to_dict(), tolerances=case.tolerances.to_dict(),
            started_at=_now(),
        )
        # The layout the flags ask for, so skipped and crashed cases carry one too; a run that
        # records its own layout (run.json) replaces it below.
        _set_layout(record, self._layout_from_flags(case))
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
        record["finished_at"] = _now()
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
        _set_layout(record, layout)
        record["layout_text"] = run_record.get("layout_text")
        ran = run_record.get("parallel") or {}
        if ran.get("schedule") and isinstance(record.get("parallel"), dict):
            record["parallel"]["schedule"] = ran["schedule"]  # what the trainer chose and ran
        steps = outputs.steps
        record["losses"] = [s.get("loss") for s in steps]
        record.update(_throughput(steps))

        if not result.ok:
            failing = self.backend.failing_rank(spec, result)
            if failing is None and spec.world_size == 1:
                failing = "0"  # one process: it is the one that failed
            record["failing_rank"] = failing
            return Outcome("failed", self._crash_text(case, spec, result, failing, rank_logs))

        t = time.time()
        lines = []
        ok = True
        ref_steps = _read_steps(reference.steps_file)
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
        header = f"{case.name}: the run differs from the single-device reference"
        footer = [f"run folder: {spec.output_dir}", f"reference: {reference.path}",
                  f"command: {shlex.join(result.argv)}"]
        return Outcome("failed", "\n".join([header, *("  " + l for l in "\n".join(lines).splitlines()), *footer]))

    # ------------------------------------------------------------------ pieces

    def _launch(self, spec: LaunchSpec) -> ProcessResult:
        spec.log_dir.mkdir(parents=True, exist_ok=True)
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
                _write_steps(folder / "steps.jsonl", outputs.steps)
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
        """The model's transformer layers from its checkpoint header (torch-free), without
        generating synthetic assets that are not there yet (their preset says it)."""
        try:
            if model in self._files:
                checkpoint = self._files[model][0]
            else:
                files = self.config.files_for(model)
                if files.synthetic:
                    from harness.assets.presets import PRESETS

                    return int(getattr(PRESETS[self.config.assets.preset], model).n_layer)
                checkpoint = files.checkpoint
            from harness.trainer.llmc import read_checkpoint_header

            return int(read_checkpoint_header(checkpoint)[1].n_layer)
        except Exception:  # unreadable or not an llm.c checkpoint (another trainer's files)
            return None

    def _layout_from_flags(self, case: Case) -> dict | None:
        """The layout the case's flags ask for (resolve_layout, as the trainer does); None when
        the model's depth is unknown or the flags do not resolve (the run will say why)."""
        num_layers = self.num_layers(case.model)
        if num_layers is None:
            return None
        try:
            from harness.layout import resolve_layout

            f = case.flags
            return resolve_layout(
                num_layers, case.pp, case.vpp,
                partition=f.get("pipeline_layer_partition"), costs=f.get("pipeline_layer_costs"),
                chunk_layout=f.get("pipeline_chunk_layout"),
                megatron_layout=f.get("pipeline_model_parallel_layout"),
            ).to_dict()
        except Exception:
            return None

    def _crash_text(self, case: Case, spec: LaunchSpec, result: ProcessResult,
                    failing: str | None, rank_logs: dict, what: str = "run") -> str:
        if result.timed_out:
            reason = (f"timed out after {self.settings.timeout_s:g} s (--harness-timeout); "
                      f"every process of the run was killed")
        elif result.returncode is not None and result.returncode < 0:
            reason = f"killed by signal {_signal_name(-result.returncode)}"
        else:
            reason = f"exit code {result.returncode}"
        if failing is not None:
            reason = f"rank {failing} of {spec.world_size} failed first; {reason}"
        lines = [f"{case.name}: the {what} failed: {reason}",
                 f"command: {shlex.join(result.argv)}",
                 f"launcher log: {result.stdout}"]
        shown = False
        ranks = [failing] if failing in rank_logs else (sorted(rank_logs) if result.timed_out else [])
        for rank in ranks:
            per_rank = TAIL_LINES if failing is not None else 6
            for path in rank_logs[rank]:
                text = tail(path, per_rank)
                if text.strip():
                    lines += [f"--- rank {rank}: {path} (last lines) ---", text]
                    shown = True
        if not shown:
            for path in (result.stderr, result.stdout):
                text = tail(path, TAIL_LINES)
                if text.strip():
                    lines += [f"--- {path} (last lines) ---", text]
        return "\n".join(lines)


def _set_layout(record: dict, layout: dict | None) -> None:
    """The record's layout, and `parallel.vpp` from it: a Megatron string or a chunk layout
    sets the chunks per stage without --virtual_pipeline_parallel."""
    record["layout"] = layout
    vpp = layout.get("vpp") if isinstance(layout, dict) else None
    if isinstance(vpp, int) and vpp >= 1:
        record["parallel"]["vpp"] = vpp


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _throughput(steps: list[dict]) -> dict[str, Any]:
    timed = steps[1:] if len(steps) > 1 else steps  # the first step includes warm-up
    def mean(key):
        values = [float(s[key]) for s in timed if s.get(key) is not None]
        values = [v for v in values if math.isfinite(v)]
        return sum(values) / len(values) if values else None
    peaks = [float(s["peak_memory_mb"]) for s in steps if s.get("peak_memory_mb") is not None]
    return {"tokens_per_s": mean("tokens_per_s"), "step_time_ms": mean("step_time_ms"),
            "peak_memory_mb": max(peaks) if peaks else None}


def _read_steps(path: Path) -> list[dict]:
    from harness.launch.backends import read_jsonl

    return read_jsonl(path)


def _write_steps(path: Path, steps: list[dict]) -> None:
    import json

    path.write_text("".join(json.dumps({"format": "harness.step/1", **s}) + "\n" for s in steps))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
