"""A run's losses against a recorded baseline's (PyTorch, Megatron): one verdict per pair.

Torch-free and plain: the log tool (harness/logs) and the live PyTorch baseline call the same
`judge_baseline`. A step counts as diverging when `|run - baseline|` is over the dtype's
threshold AND over the print resolution (InfiniTrain prints 6 decimals, so a difference at or
below 1e-6 is never counted). A bad pairing (other steps than the run's, a NaN, a dtype with no
threshold) is `ok=False` with `problem` saying which file and what was expected; it is never a
pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

# Thresholds per dtype: ("relative", r) is |diff| <= r * max(|baseline loss|, 1.0) per step;
# ("absolute", a) is |diff| <= a.
#   float32, relative 1e-5: measured (docs/infinitrain.md "Against a recorded baseline"): InfiniTrain master
#     and the bundled PyTorch trainer on the same files and flags differed by at most 2.3e-6
#     relative (1.3e-5 absolute at loss 5.56, the `basic/gpt2/2` shape); InfiniTrain-Test's
#     compare_loss.py absolute 1e-5 would fail that noise, a scale-free 1e-5 passes it.
#   bfloat16, absolute 1e-2: InfiniTrain-Test's baseline/megatron/scripts/compare_loss.py; not
#     measured here.
BASELINE_THRESHOLDS: dict[str, tuple[str, float]] = {
    "float32": ("relative", 1e-5),
    "bfloat16": ("absolute", 1e-2),
}
LOSS_SCALE_FLOOR = 1.0
# A printed loss carries rounding: a difference this close to the resolution is the resolution.
_RESOLUTION_SLACK = 1e-6


def threshold_text(dtype: str) -> str:
    """`relative 1e-05` / `absolute 0.01`, or `none` for a dtype with no threshold."""
    kind, value = BASELINE_THRESHOLDS.get(dtype, ("none", math.nan))
    return "none" if kind == "none" else f"{kind} {value:g}"


def allowed_diff(dtype: str, baseline_loss: float) -> float:
    """The largest |run - baseline| the dtype's threshold passes at a step whose baseline loss
    is given."""
    kind, value = BASELINE_THRESHOLDS[dtype]
    return value * max(abs(baseline_loss), LOSS_SCALE_FLOOR) if kind == "relative" else value


def step_limit(dtype: str, baseline_loss: float, resolution: float) -> float:
    """The largest |run - baseline| that passes at a step: the dtype's threshold, but never
    below the print resolution (a difference there is the printing's, not the trainer's). The
    one rule the verdict counts diverging steps by and the report's divergence plot draws."""
    return max(allowed_diff(dtype, baseline_loss), resolution * (1 + _RESOLUTION_SLACK))


@dataclass(frozen=True)
class BaselineVerdict:
    """The losses of one run against its baseline's, per common step."""

    ok: bool
    dtype: str
    threshold: str  # "relative 1e-05" / "absolute 0.01"
    steps: tuple[int, ...]
    diffs: tuple[float, ...]  # |run - baseline| per step of `steps`
    first_diverging_step: int | None
    worst_step: int | None  # the step of the largest |diff|
    max_abs_diff: float
    max_rel_diff: float  # largest |diff| / max(|baseline|, 1.0)
    problem: str | None  # a bad pairing; then ok is False
    run_losses: tuple[float, ...] = ()
    base_losses: tuple[float, ...] = ()
    resolution: float = 1e-6  # the run's print resolution the verdict was judged with

    def _losses_at(self, step: int) -> tuple[float, float, float]:
        i = self.steps.index(step)
        return self.run_losses[i], self.base_losses[i], self.diffs[i]

    def lines(self) -> list[str]:
        """What a failure (or a pass) says: the first diverging step with both losses, and the
        worst difference against the threshold."""
        if self.problem:
            return [f"bad pairing: {self.problem}"]
        out = []
        if self.first_diverging_step is not None:
            run, base, diff = self._losses_at(self.first_diverging_step)
            out.append(f"first diverging step {self.first_diverging_step}: run {run:.6f} "
                       f"baseline {base:.6f} (|diff| {diff:.2g} > "
                       f"{allowed_diff(self.dtype, base):.2g})")
        if self.worst_step is not None:
            run, base, diff = self._losses_at(self.worst_step)
            out.append(f"worst |diff| {diff:.2g} at step {self.worst_step} (run {run:.6f} "
                       f"baseline {base:.6f}; threshold {self.threshold})")
        return out

    def to_dict(self) -> dict:
        """JSON-safe (no NaN or inf: those become None)."""
        def clean(x):
            return x if isinstance(x, (int, type(None))) or math.isfinite(x) else None

        return {"ok": self.ok, "dtype": self.dtype, "threshold": self.threshold,
                "steps": list(self.steps), "diffs": [clean(d) for d in self.diffs],
                "first_diverging_step": self.first_diverging_step,
                "worst_step": self.worst_step, "max_abs_diff": clean(self.max_abs_diff),
                "max_rel_diff": clean(self.max_rel_diff), "problem": self.problem,
                "run_losses": [clean(x) for x in self.run_losses],
                "base_losses": [clean(x) for x in self.base_losses],
                "resolution": self.resolution}


def bad_pairing(dtype: str, problem: str) -> BaselineVerdict:
    """The verdict of a pair that cannot be judged (`problem` names the file and what was
    expected)."""
    return BaselineVerdict(ok=False, dtype=dtype, threshold=threshold_text(dtype), steps=(),
                           diffs=(), first_diverging_step=None, worst_step=None,
                           max_abs_diff=math.nan, max_rel_diff=math.nan, problem=problem)


def judge_baseline(run_steps: Sequence[int], run_losses: Sequence[float],
                   base_steps: Sequence[int], base_losses: Sequence[float], dtype: str, *,
                   resolution: float = 1e-6, where: str = "") -> BaselineVerdict:
    """The verdict of a run's losses against a baseline's, step by step. `where` names the
    pair (files, sections) in every problem."""
    at = f"{where}: " if where else ""
    run_steps, base_steps = tuple(int(s) for s in run_steps), tuple(int(s) for s in base_steps)
    run_losses, base_losses = tuple(map(float, run_losses)), tuple(map(float, base_losses))
    if dtype not in BASELINE_THRESHOLDS:
        return bad_pairing(dtype, f"{at}no baseline threshold for dtype {dtype!r}; expected one "
                                  f"of {sorted(BASELINE_THRESHOLDS)}")
    for side, steps, losses in (("run", run_steps, run_losses),
                                ("baseline", base_steps, base_losses)):
        if len(steps) != len(losses):
            return bad_pairing(dtype, f"{at}the {side} has {len(steps)} steps but "
                                      f"{len(losses)} losses; expected one loss a step")
        if not steps:
            return bad_pairing(dtype, f"{at}the {side} has no steps; expected step losses")
        if len(set(steps)) != len(steps):
            return bad_pairing(dtype, f"{at}the {side} has a step twice; expected each once")
        bad = [s for s, x in zip(steps, losses) if not math.isfinite(x)]
        if bad:
            return bad_pairing(dtype, f"{at}the {side} loss at step {bad[0]} is "
                                      f"{losses[steps.index(bad[0])]}; expected a finite loss")
    if sorted(run_steps) != sorted(base_steps):
        return bad_pairing(dtype, f"{at}the baseline has steps {_span(base_steps)}, the run "
                                  f"{_span(run_steps)}; expected the run's steps")
    base = dict(zip(base_steps, base_losses))
    steps = tuple(sorted(run_steps))
    run = dict(zip(run_steps, run_losses))
    runs = tuple(run[s] for s in steps)
    bases = tuple(base[s] for s in steps)
    diffs = tuple(abs(r - b) for r, b in zip(runs, bases))
    diverging = [s for s, d, b in zip(steps, diffs, bases)
                 if d > step_limit(dtype, b, resolution)]
    worst = max(range(len(steps)), key=lambda i: diffs[i])
    rel = max(d / max(abs(b), LOSS_SCALE_FLOOR) for d, b in zip(diffs, bases))
    return BaselineVerdict(ok=not diverging, dtype=dtype, threshold=threshold_text(dtype),
                           steps=steps, diffs=diffs,
                           first_diverging_step=diverging[0] if diverging else None,
                           worst_step=steps[worst], max_abs_diff=diffs[worst], max_rel_diff=rel,
                           problem=None, run_losses=runs, base_losses=bases,
                           resolution=resolution)


def _span(steps: Sequence[int]) -> str:
    s = sorted(steps)
    if s and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0])
    return ",".join(map(str, s))
