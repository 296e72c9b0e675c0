"""The baseline check of a case: "is the trainer right at all?", against an independent
implementation, kept apart from the self-check ("did parallelism change the numbers?").

`--harness-baseline pytorch` runs the bundled PyTorch trainer with the subject's semantics
(harness.contracts.semantics) on one device, on the case's global batch, and compares every
step's loss with the case's (harness.compare.baseline); where the case dumped gradients
(InfiniTrain's #209 GPT-2), the baseline dumps its first step's too, and every parameter is
compared under the bundled trainer's name (harness.contracts.semantics), with the self-check's
thresholds, a TP rank's un-gathered file against its slice. Those runs are cached like
references, one per key (model, model files, baseline flags, whether it dumped gradients,
device, the bundled trainer's version), in `<reference cache>/baselines/`, so a warm session
runs none. A case the bundled trainer cannot
match (LoRA, a flag with no recorded counterpart) gets a skipped baseline with the reason; a
case that crashed gets none (`not run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.compare.baseline import BaselineVerdict, LrVerdict, judge_baseline, judge_lr
from harness.compare.diff import GradientDiff, gradient_names
from harness.compare.render import gradient_lines
from harness.contracts.records import read_jsonl, write_steps
from harness.contracts.semantics import BaselineUnmatched
from harness.launch import HarnessBackend
from harness.reference import ReferenceCache, ReferenceError, reference_key

from harness.contracts.trace import trace_flags

from .gradients import GradientRequest, compare_with_baseline

PYTORCH = "pytorch"
BASELINE_STATUSES = ("passed", "failed", "skipped", "error")


@dataclass(frozen=True)
class BaselineCheck:
    """One case's baseline check: its status, why, and the comparison when one was made."""
    source: str  # "pytorch (live)", or the recorded file it was read from
    status: str  # passed | failed | skipped | error
    reason: str | None = None
    verdict: BaselineVerdict | None = None
    losses: tuple = ()
    steps: tuple = ()
    run: dict = field(default_factory=dict)  # the baseline run: key, path, built, command, flags
    note: str | None = None  # e.g. a Megatron log's corrected step 2
    gradients: GradientDiff | None = None  # the first step's gradients, where both dumped them
    gradients_reason: str | None = None  # why they were not compared
    lr: LrVerdict | None = None  # the printed lr per step, where the baseline has one
    # step 1 module by module (harness.compare.trace's record form), where both were traced
    trace: dict | None = None

    def __post_init__(self) -> None:
        if self.status not in BASELINE_STATUSES:
            raise ValueError(f"baseline status {self.status!r}; expected one of "
                             f"{', '.join(BASELINE_STATUSES)}")

    def lines(self) -> list[str]:
        """The failure text's baseline part."""
        head = f"baseline ({self.source}): {self.status}"
        lines = []
        if self.verdict is not None and not self.verdict.ok:
            lines += ["  " + line for line in self.verdict.lines()]
        if self.lr is not None and not self.lr.ok:
            lines += ["  the learning rate per step against the baseline's:",
                      *("    " + line for line in self.lr.lines())]
        if self.gradients is not None and not self.gradients.ok:
            lines += ["  gradients of the first step against the baseline's:",
                      *("    " + line for line in gradient_lines(self.gradients))]
        if self.trace is not None and self.trace.get("status") == "diverged":
            lines += [f"  modules of step {self.trace['step']} against the baseline's: "
                      f"{self.trace['line']}"]
        if self.trace is not None and (self.trace.get("blame") or {}).get("status") == "blamed":
            lines += [f"  each module of step {self.trace['step']} on the subject's own "
                      f"inputs: {self.trace['blame']['line']}"]
        if lines:
            return [head, *lines]
        return [head + (f": {self.reason}" if self.reason else "")]

    def record(self) -> dict:
        """The result record's `baseline` field."""
        out = {"source": self.source, "status": self.status, "reason": self.reason,
               "first_diverging_step": None, "max_abs_diff": None, "loss": None,
               "losses": list(self.losses), "steps": list(self.steps), "note": self.note,
               "gradients": None if self.gradients is None else self.gradients.to_dict(),
               "gradients_reason": self.gradients_reason,
               "lr": None if self.lr is None else self.lr.to_dict(),
               "trace": self.trace,
               **({"run": self.run} if self.run else {})}
        if self.verdict is not None:
            out["loss"] = self.verdict.to_dict()
            out["first_diverging_step"] = self.verdict.first_diverging_step
            out["max_abs_diff"] = self.verdict.max_abs_diff
        return out


def with_module_check(check: BaselineCheck, trace: dict) -> BaselineCheck:
    """The check with its step-1 module comparison (harness.runner.trace): a divergence fails
    it, with the first diverging module in its reason, and so does a module its replay blames
    on its own inputs (trace["blame"], harness.runner.replay); a trace not taken is only
    recorded."""
    reasons = []
    if trace.get("status") == "diverged":
        reasons.append(f"modules at step {trace['step']}: {trace['line']}")
    blame = trace.get("blame") or {}
    if blame.get("status") == "blamed":
        reasons.append(f"module replay at step {trace['step']}: {blame['line']}")
    if not reasons:
        return replace(check, trace=trace)
    return replace(check, trace=trace, status="failed",
                   reason="; ".join(filter(None, [check.reason, *reasons])))


def judged(source: str, run_steps: list[dict], base_steps: list[int], base_losses: list[float],
           dtype: str, first_step: int, run: dict | None = None,
           note: str | None = None, gradients: GradientDiff | None = None,
           gradients_reason: str | None = None,
           base_lrs: list[float] | None = None,
           base_lr_resolutions: list[float] | None = None) -> BaselineCheck:
    """The check of a run's steps (and, when given, its compared gradients and the baseline's
    lr per step: `base_lrs`, printed to `base_lr_resolutions`, 0 at full precision) against a
    baseline's, from `first_step` on (a resumed run starts later; the baseline ran from the
    start). It fails when any fails."""
    pairs = [(s, l) for s, l in zip(base_steps, base_losses) if s >= first_step]
    verdict = judge_baseline([int(s["step"]) for s in run_steps],
                             [float(s["loss"]) for s in run_steps],
                             [s for s, _ in pairs], [l for _, l in pairs], dtype,
                             resolution=_resolution(run_steps), where=source)
    lr = None
    if base_lrs is not None and not any(_finite(s.get("lr")) for s in run_steps):
        # a trainer that prints no lr column at all (a command trainer): said, not failed
        note = "; ".join(filter(None, [note, "lr not compared: the run printed none"]))
    elif base_lrs is not None:
        # the run's printed steps (a tiny_mixtral --log_interval prints some; the loss check
        # above judges whether the run printed the steps it should)
        printed = {int(s["step"]) for s in run_steps}
        kept = [i for i, s in enumerate(base_steps) if s >= first_step and s in printed]
        lr = judge_lr([int(s["step"]) for s in run_steps], [_lr(s) for s in run_steps],
                      [float(s.get("lr_resolution") or 0.0) for s in run_steps],
                      [base_steps[i] for i in kept], [base_lrs[i] for i in kept],
                      [(base_lr_resolutions or [0.0] * len(base_lrs))[i] for i in kept],
                      where=source)
    reasons = ([] if verdict.ok else [verdict.problem or _first(verdict)]) + \
        ([] if lr is None or lr.ok else [lr.problem or _lr_first(lr)]) + \
        ([] if gradients is None or gradients.ok else [_gradients_first(gradients)])
    return BaselineCheck(source, "failed" if reasons else "passed",
                         reason="; ".join(reasons) or None,
                         verdict=verdict, losses=tuple(l for _, l in pairs),
                         steps=tuple(s for s, _ in pairs), run=dict(run or {}), note=note,
                         gradients=gradients, gradients_reason=gradients_reason, lr=lr)


def _finite(value) -> bool:
    return value is not None and math.isfinite(float(value))


def _lr(step: dict) -> float:
    """A step's lr; NaN where the run printed none (judge_lr names that step)."""
    value = step.get("lr")
    return math.nan if value is None else float(value)


def _lr_first(verdict: LrVerdict) -> str:
    return (f"lr: first diverging step {verdict.first_diverging_step}, worst |diff| "
            f"{verdict.max_abs_diff:.3g} at step {verdict.worst_step}")


def _first(verdict: BaselineVerdict) -> str:
    return (f"first diverging step {verdict.first_diverging_step}, worst |diff| "
            f"{verdict.max_abs_diff:.3g} at step {verdict.worst_step} ({verdict.threshold})")


def _gradients_first(diff: GradientDiff) -> str:
    """The gradients' part of a failed check's one-line reason."""
    if diff.missing or diff.extra or diff.shape_errors:
        return (f"gradients: {len(diff.missing)} missing, {len(diff.extra)} without a baseline "
                f"counterpart, {len(diff.shape_errors)} of another shape")
    worst = diff.relative_failures[0] if diff.relative_failures else diff.worst(1)[0]
    return (f"gradients: {len(diff.relative_failures) or len(diff.mismatched)} of "
            f"{diff.parameters} parameters differ, worst {worst.name} (relative error "
            f"{worst.relative_error:.3g})")


def _resolution(steps: list[dict]) -> float:
    """The coarsest print resolution of the run's losses (InfiniTrain's 6 decimals: 1e-6)."""
    found = [float(s["loss_resolution"]) for s in steps if s.get("loss_resolution")]
    return max(found, default=0.0)


class LiveBaseline:
    """Runs (once per key, cached) and judges the PyTorch baseline of a foreign trainer's case.

    `run` is the case runner's: (backend, name, model, flags, checkpoint, input_bin, folder,
    gradients) -> its Ran (`launched.result`, `outputs`, `failed`), one process (its first
    step's gradients dumped into `folder/gradients` when asked) through the
    same lease, launch and collect stages as a case (harness.runner.stages); handed in, since
    the runner imports this module."""

    def __init__(self, settings, run, progress=None) -> None:
        self.settings = settings
        self.run = run
        self.progress = progress
        self.backend = HarnessBackend()
        self.cache = ReferenceCache(Path(settings.reference_root) / "baselines")

    def check(self, subject, model: str, case_name: str, args: dict, run_steps: list[dict],
              checkpoint: Path, input_bin: Path, first_step: int,
              gradients: GradientRequest | None = None,
              gradients_reason: str | None = None) -> BaselineCheck:
        """The case's baseline check; `gradients` when the case dumped comparable gradients,
        else `gradients_reason` says why none are compared."""
        source = f"{PYTORCH} (live)"
        try:
            flags = subject.baseline_flags(model, args)
        except BaselineUnmatched as unmatched:
            return BaselineCheck(source, "skipped", reason=str(unmatched))
        family = flags.pop("model")  # the bundled trainer's family (gpt2's is gpt2)
        dumps = gradients is not None
        key = reference_key(family, {"checkpoint": checkpoint, "input_bin": input_bin},
                            {**flags, "baseline": PYTORCH,
                             **({"dump_gradients": "<entry>/gradients"} if dumps else {})},
                            self.settings.device, self.backend.version())
        try:
            entry = self.cache.get_or_build(
                key, lambda folder: self._build(family, case_name, flags, checkpoint,
                                                input_bin, folder, dumps))
        except ReferenceError as error:
            return BaselineCheck(source, "error", reason=str(error).splitlines()[0])
        steps = read_jsonl(entry.steps_file)
        run = {"key": self.cache.entry_name(key), "path": str(entry.path),
               "built": entry.built, "command": entry.info.get("command"), "model": family,
               "flags": flags}
        diff = None
        if gradients is not None:
            try:
                diff = compare_with_baseline(model, gradients, entry.gradients_dir)
            except BaselineUnmatched as unmatched:  # the losses are still judged; said why
                gradients_reason = str(unmatched)
        return judged(source, run_steps, [int(s["step"]) for s in steps],
                      [float(s["loss"]) for s in steps], flags["dtype"], first_step, run,
                      gradients=diff, gradients_reason=gradients_reason,
                      base_lrs=[s.get("lr") for s in steps])  # None: judge_lr names it

    def trace_dump(self, subject, model: str, args: dict, checkpoint: Path, input_bin: Path,
                   step: int) -> Path:
        """The PyTorch baseline's module-level trace of `step` for these case flags (its
        --precision_check folder), cached as its runs are: once per key. BaselineUnmatched
        where no flags compute the case; ReferenceError where its run failed."""
        flags = subject.baseline_flags(model, args)
        family = flags.pop("model")
        key = reference_key(family, {"checkpoint": checkpoint, "input_bin": input_bin},
                            {**trace_flags(flags, step, "<entry>/trace"), "baseline": PYTORCH},
                            self.settings.device, self.backend.version())

        def build(folder: Path) -> dict:
            ran = self.run(self.backend, "baseline-trace", family,
                           trace_flags(flags, step, folder / "trace"), checkpoint, input_bin,
                           folder, False)
            result = ran.launched.result
            if ran.failed:
                raise ReferenceError(f"the PyTorch baseline's traced run to step {step} failed:"
                                     f" {ran.outputs.problem or f'exit code {result.returncode}'}"
                                     f" (log {result.stderr})")
            return {"command": list(result.argv), "duration_s": result.duration_s}

        return self.cache.get_or_build(key, build).path / "trace"

    def _build(self, model: str, case_name: str, flags: dict, checkpoint: Path,
               input_bin: Path, folder: Path, gradients: bool = False) -> dict:
        """The baseline's run (lease, launch, collect as a case's), then judged: a crash, no
        steps or a non-finite loss is refused; then its steps written for the cache."""
        if self.progress is not None:
            self.progress(f"running the PyTorch baseline of {case_name} (one device; once per "
                          f"key, then cached in {self.cache.root})")
        ran = self.run(self.backend, "baseline", model, dict(flags), checkpoint, input_bin,
                       folder, gradients)
        result, outputs = ran.launched.result, ran.outputs
        problem = None
        if ran.failed:
            problem = outputs.problem or f"exit code {result.returncode}"
        elif not outputs.steps:
            problem = "it recorded no steps"
        elif not all(math.isfinite(float(s["loss"])) for s in outputs.steps):
            problem = "a non-finite loss"
        elif gradients and not gradient_names(folder / "gradients"):
            problem = f"it dumped no gradients into {folder / 'gradients'}"
        if problem:
            raise ReferenceError(f"the PyTorch baseline run of {case_name} failed: {problem} "
                                 f"(command: {' '.join(map(str, result.argv))}; log "
                                 f"{result.stderr})")
        if not (folder / "steps.jsonl").is_file():
            write_steps(folder / "steps.jsonl", outputs.steps)
        return {"command": list(result.argv), "duration_s": result.duration_s}
