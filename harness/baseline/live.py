"""The baseline check of a case: "is the trainer right at all?", against an independent
implementation, kept apart from the self-check ("did parallelism change the numbers?").

`--harness-baseline pytorch` runs the bundled PyTorch trainer with the subject's semantics
(harness.baseline.semantics) on one device, on the case's global batch, and compares every
step's loss with the case's (harness.compare.baseline). Those runs are cached like references,
one per key (model, model files, baseline flags, device, the bundled trainer's version), in
`<reference cache>/baselines/`, so a warm session runs none. A case the bundled trainer cannot
match (LoRA, a flag with no recorded counterpart) gets a skipped baseline with the reason; a
case that crashed gets none (`not run`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.compare.baseline import BaselineVerdict, judge_baseline
from harness.launch import HarnessBackend
from harness.reference import ReferenceCache, ReferenceError, reference_key
from harness.contracts.records import read_jsonl, write_steps

from .semantics import BaselineUnmatched

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

    def __post_init__(self) -> None:
        if self.status not in BASELINE_STATUSES:
            raise ValueError(f"baseline status {self.status!r}; expected one of "
                             f"{', '.join(BASELINE_STATUSES)}")

    def lines(self) -> list[str]:
        """The failure text's baseline part."""
        head = f"baseline ({self.source}): {self.status}"
        if self.verdict is not None and not self.verdict.ok:
            return [head, *("  " + line for line in self.verdict.lines())]
        return [head + (f": {self.reason}" if self.reason else "")]

    def record(self) -> dict:
        """The result record's `baseline` field."""
        out = {"source": self.source, "status": self.status, "reason": self.reason,
               "first_diverging_step": None, "max_abs_diff": None, "loss": None,
               "losses": list(self.losses), "steps": list(self.steps), "note": self.note,
               **({"run": self.run} if self.run else {})}
        if self.verdict is not None:
            out["loss"] = self.verdict.to_dict()
            out["first_diverging_step"] = self.verdict.first_diverging_step
            out["max_abs_diff"] = self.verdict.max_abs_diff
        return out


def judged(source: str, run_steps: list[dict], base_steps: list[int], base_losses: list[float],
           dtype: str, first_step: int, run: dict | None = None,
           note: str | None = None) -> BaselineCheck:
    """The check of a run's steps against a baseline's, from `first_step` on (a resumed run
    starts later; the baseline ran from the start)."""
    pairs = [(s, l) for s, l in zip(base_steps, base_losses) if s >= first_step]
    verdict = judge_baseline([int(s["step"]) for s in run_steps],
                             [float(s["loss"]) for s in run_steps],
                             [s for s, _ in pairs], [l for _, l in pairs], dtype,
                             resolution=_resolution(run_steps), where=source)
    return BaselineCheck(source, "passed" if verdict.ok else "failed",
                         reason=None if verdict.ok else (verdict.problem or _first(verdict)),
                         verdict=verdict, losses=tuple(l for _, l in pairs),
                         steps=tuple(s for s, _ in pairs), run=dict(run or {}), note=note)


def _first(verdict: BaselineVerdict) -> str:
    return (f"first diverging step {verdict.first_diverging_step}, worst |diff| "
            f"{verdict.max_abs_diff:.3g} at step {verdict.worst_step} ({verdict.threshold})")


def _resolution(steps: list[dict]) -> float:
    """The coarsest print resolution of the run's losses (InfiniTrain's 6 decimals: 1e-6)."""
    found = [float(s["loss_resolution"]) for s in steps if s.get("loss_resolution")]
    return max(found, default=0.0)


class LiveBaseline:
    """Runs (once per key, cached) and judges the PyTorch baseline of a foreign trainer's case.

    `run` is the case runner's: (backend, name, model, flags, checkpoint, input_bin, folder) ->
    its Ran (`launched.result`, `outputs`, `failed`), one process with no gradients through the
    same lease, launch and collect stages as a case (harness.runner.stages); handed in, since
    the runner imports this module."""

    def __init__(self, settings, run, progress=None) -> None:
        self.settings = settings
        self.run = run
        self.progress = progress
        self.backend = HarnessBackend()
        self.cache = ReferenceCache(Path(settings.reference_root) / "baselines")

    def check(self, subject, model: str, case_name: str, args: dict, run_steps: list[dict],
              checkpoint: Path, input_bin: Path, first_step: int) -> BaselineCheck:
        source = f"{PYTORCH} (live)"
        try:
            flags = subject.baseline_flags(model, args)
        except BaselineUnmatched as unmatched:
            return BaselineCheck(source, "skipped", reason=str(unmatched))
        key = reference_key(model, {"checkpoint": checkpoint, "input_bin": input_bin},
                            {**flags, "baseline": PYTORCH}, self.settings.device,
                            self.backend.version())
        try:
            entry = self.cache.get_or_build(
                key, lambda folder: self._build(model, case_name, flags, checkpoint,
                                                input_bin, folder))
        except ReferenceError as error:
            return BaselineCheck(source, "error", reason=str(error).splitlines()[0])
        steps = read_jsonl(entry.steps_file)
        run = {"key": self.cache.entry_name(key), "path": str(entry.path),
               "built": entry.built, "command": entry.info.get("command"), "flags": flags}
        return judged(source, run_steps, [int(s["step"]) for s in steps],
                      [float(s["loss"]) for s in steps], flags["dtype"], first_step, run)

    def _build(self, model: str, case_name: str, flags: dict, checkpoint: Path,
               input_bin: Path, folder: Path) -> dict:
        """The baseline's run (lease, launch, collect as a case's), then judged: a crash, no
        steps or a non-finite loss is refused; then its steps written for the cache."""
        if self.progress is not None:
            self.progress(f"running the PyTorch baseline of {case_name} (one device; once per "
                          f"key, then cached in {self.cache.root})")
        ran = self.run(self.backend, "baseline", model, dict(flags), checkpoint, input_bin,
                       folder)
        result, outputs = ran.launched.result, ran.outputs
        problem = None
        if ran.failed:
            problem = outputs.problem or f"exit code {result.returncode}"
        elif not outputs.steps:
            problem = "it recorded no steps"
        elif not all(math.isfinite(float(s["loss"])) for s in outputs.steps):
            problem = "a non-finite loss"
        if problem:
            raise ReferenceError(f"the PyTorch baseline run of {case_name} failed: {problem} "
                                 f"(command: {' '.join(map(str, result.argv))}; log "
                                 f"{result.stderr})")
        if not (folder / "steps.jsonl").is_file():
            write_steps(folder / "steps.jsonl", outputs.steps)
        return {"command": list(result.argv), "duration_s": result.duration_s}
