"""A run's losses against a recorded baseline's (PyTorch, Megatron): one verdict per pair.

Torch-free and plain: the log tool (harness/logs) and the live PyTorch baseline call the same
`judge_baseline`. A step counts as diverging when `|run - baseline|` is over the dtype's
threshold AND over the print resolution (InfiniTrain prints 6 decimals, so a difference at or
below 1e-6 is never counted). A bad pairing (other steps than the run's, a NaN, a dtype with no
threshold) is `ok=False` with `problem` saying which file and what was expected; it is never a
pass.

The learning rate each step line prints is judged beside the loss (`judge_lr`): within print
resolution, never as strings (see LR_RELATIVE_SLACK and `printed_resolution`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

# Thresholds per dtype: ("relative", r) is |diff| <= r * max(|baseline loss|, 1.0) per step;
# ("absolute", a) is |diff| <= a.
#   float32, relative 1e-5: measured (docs/infinitrain_baseline.md "Against a recorded baseline"): InfiniTrain master
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


# bfloat16 keeps 8 significant bits (7 stored): one unit in the last place of a value in
# [2**e, 2**(e+1)) is 2**(e-7).
BFLOAT16_MANTISSA_BITS = 7
# A loss printed `{:.6f}` is its value to half a unit of the sixth decimal: a bfloat16 value
# with seven decimals (1.0078125, one unit in [1, 2)) prints 1.007812, exactly half a unit off,
# 5.0000000007e-07 in float64; the slack keeps it one.
_PRINTED_HALF_UNIT = 5e-7 * (1 + 1e-6)


def _bfloat16_ulp(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(abs(x))) - BFLOAT16_MANTISSA_BITS)


def bfloat16_loss_resolution(*sides: Sequence[float]) -> float | None:
    """Where every printed loss of every side is a bfloat16 value (a run that computes its loss
    in bfloat16: InfiniTrain's bf16 cases before `add_autocast`, 2025-10-28, print 4.906250 and
    4.937500, one bfloat16 unit apart), the largest unit in the last place among them: what the
    trainer can print there. None where any loss is not one (a float32 loss, whatever the
    compute dtype)."""
    values = [float(x) for side in sides for x in side]
    if not values or any(not math.isfinite(x) or x == 0 for x in values):
        return None
    for x in values:
        ulp = _bfloat16_ulp(x)
        if abs(x - round(x / ulp) * ulp) > _PRINTED_HALF_UNIT:
            return None
    return max(_bfloat16_ulp(x) for x in values)


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


# --- the printed learning rate -------------------------------------------------------------

# What float representation adds to a compared lr, relative to the larger value: a decimal text
# parsed to a double, or an lr computed in float32 (InfiniTrain: feat/lr_scheduler@a7949ac:
# infini_train/src/lr_scheduler.cc computes in `float`, about 6e-8 relative) against one
# computed in double. Far below any printed place (`{:.2e}` keeps 3 significant digits), so it
# never hides a schedule's drift.
LR_RELATIVE_SLACK = 1e-6

_DECIMAL = re.compile(r"[+-]?(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[+-]?\d+))?")


def printed_resolution(text: str) -> float | None:
    """One unit in the last printed place of a number (`5.585794` -> 1e-6, `12` -> 1,
    `1.5e-03` -> 1e-4); None when the text is not a finite decimal number (`nan`, `-inf`).

    A zero in scientific notation (`0.00e+00`, Megatron's `0.000000E+00`) is exact (0.0):
    `{:.2e}` prints every non-zero value with its own exponent (a mantissa of 1 to 9.99), so
    only an exact zero prints a zero mantissa; the naive 10**(0-2) would pass anything below
    1e-2 against a warmup step's lr 0. A zero in fixed notation (`0.000000`) keeps its place:
    a value below half a unit prints so."""
    match = _DECIMAL.fullmatch(text)
    if match is None or not (match["int"] or match["frac"]):
        return None
    digits = (match["int"] or "") + (match["frac"] or "")
    if match["exp"] is not None and not digits.strip("0"):
        return 0.0
    exponent = int(match["exp"] or 0) - len(match["frac"] or "")
    return 10.0 ** exponent


def lr_limit(run_lr: float, base_lr: float, run_resolution: float,
             base_resolution: float) -> float:
    """The largest |run - base| two printed lrs may differ by: one unit in the last printed
    place of the coarser side (0 at full precision, or for a printed exact zero), plus
    LR_RELATIVE_SLACK of the larger value. Measured by InfiniTensor: the two sides round an
    exact half differently (8.87e-06 against 8.88e-06 for 8.875e-06), one unit apart."""
    return (max(run_resolution, base_resolution)
            + LR_RELATIVE_SLACK * max(abs(run_lr), abs(base_lr)))


@dataclass(frozen=True)
class LrVerdict:
    """The learning rates a run printed against its baseline's, per common step."""

    ok: bool
    steps: tuple[int, ...]
    run_lrs: tuple[float, ...]
    base_lrs: tuple[float, ...]
    limits: tuple[float, ...]  # the largest |run - base| passed at each step (lr_limit)
    first_diverging_step: int | None
    worst_step: int | None  # the step of the largest |run - base|
    max_abs_diff: float
    problem: str | None  # a bad pairing: a missing lr (NaN), other steps; then ok is False

    def _at(self, step: int) -> tuple[float, float, float, float]:
        i = self.steps.index(step)
        run, base = self.run_lrs[i], self.base_lrs[i]
        return run, base, abs(run - base), self.limits[i]

    def lines(self) -> list[str]:
        """What a failure (or a pass) says, approx-style: the first diverging step with both
        lrs and the limit it is over, and the worst difference."""
        if self.problem:
            return [f"bad pairing: {self.problem}"]
        out = []
        if self.first_diverging_step is not None:
            run, base, diff, limit = self._at(self.first_diverging_step)
            out.append(f"lr first diverging step {self.first_diverging_step}: run {run:.6g} == "
                       f"baseline {base:.6g} ± {limit:.1e} failed (|diff| {diff:.2g})")
        if self.worst_step is not None:
            run, base, diff, limit = self._at(self.worst_step)
            out.append(f"worst lr |diff| {diff:.2g} at step {self.worst_step} (run {run:.6g} "
                       f"baseline {base:.6g}; limit {limit:.1e})")
        return out

    def to_dict(self) -> dict:
        """JSON-safe (no NaN or inf: those become None)."""
        def clean(x):
            return x if isinstance(x, (int, type(None))) or math.isfinite(x) else None

        return {"ok": self.ok, "steps": list(self.steps),
                "run_lrs": [clean(x) for x in self.run_lrs],
                "base_lrs": [clean(x) for x in self.base_lrs],
                "limits": [clean(x) for x in self.limits],
                "first_diverging_step": self.first_diverging_step,
                "worst_step": self.worst_step, "max_abs_diff": clean(self.max_abs_diff),
                "problem": self.problem}


def _lr_problem(problem: str) -> LrVerdict:
    return LrVerdict(ok=False, steps=(), run_lrs=(), base_lrs=(), limits=(),
                     first_diverging_step=None, worst_step=None, max_abs_diff=math.nan,
                     problem=problem)


def _resolution(value) -> float:
    """A side's print resolution as given; None (no printed place known) is full precision,
    the strictest reading."""
    return 0.0 if value is None else float(value)


def judge_lr(run_steps: Sequence[int], run_lrs: Sequence[float | None],
             run_resolutions: Sequence[float | None], base_steps: Sequence[int],
             base_lrs: Sequence[float | None], base_resolutions: Sequence[float | None],
             where: str) -> LrVerdict:
    """The verdict of a run's printed lr against a baseline's, step by step (`lr_limit`).
    Resolutions are one unit in each lr's last printed place (`printed_resolution`), 0 at full
    precision. Other steps than the run's, or a missing lr (None or NaN) on either side, is a
    `problem` naming `where` and the step: never a pass."""
    at = f"{where}: " if where else ""
    run_steps, base_steps = tuple(int(s) for s in run_steps), tuple(int(s) for s in base_steps)
    run_lrs = tuple(math.nan if x is None else float(x) for x in run_lrs)
    base_lrs = tuple(math.nan if x is None else float(x) for x in base_lrs)
    run_res = tuple(_resolution(x) for x in run_resolutions)
    base_res = tuple(_resolution(x) for x in base_resolutions)
    for side, steps, lrs, res in (("run", run_steps, run_lrs, run_res),
                                  ("baseline", base_steps, base_lrs, base_res)):
        if not (len(steps) == len(lrs) == len(res)):
            return _lr_problem(f"{at}the {side} has {len(steps)} steps, {len(lrs)} lrs and "
                               f"{len(res)} resolutions; expected one lr and one resolution a "
                               "step")
        if not steps:
            return _lr_problem(f"{at}the {side} has no steps; expected an lr per step")
        if len(set(steps)) != len(steps):
            return _lr_problem(f"{at}the {side} has a step twice; expected each once")
        bad = [(s, r) for s, r in zip(steps, res) if not (math.isfinite(r) and r >= 0)]
        if bad:
            return _lr_problem(f"{at}the {side} lr's print resolution at step {bad[0][0]} is "
                               f"{bad[0][1]}; expected a finite resolution >= 0")
    if sorted(run_steps) != sorted(base_steps):
        return _lr_problem(f"{at}the baseline has lrs at steps {_span(base_steps)}, the run at "
                           f"{_span(run_steps)}; expected the run's steps")
    steps = tuple(sorted(run_steps))
    run = {s: (x, r) for s, x, r in zip(run_steps, run_lrs, run_res)}
    base = {s: (x, r) for s, x, r in zip(base_steps, base_lrs, base_res)}
    for s in steps:
        missing = [side for side, lr in (("run", run[s][0]), ("baseline", base[s][0]))
                   if not math.isfinite(lr)]
        if missing:
            other = "baseline" if missing == ["run"] else "run"
            has = (f" (the {other} printed {(base if other == 'baseline' else run)[s][0]:.6g})"
                   if len(missing) == 1 else "")
            return _lr_problem(f"{at}the {' and the '.join(missing)} printed no lr at step {s}"
                               f"{has}; expected a finite learning rate at every step")
    runs = tuple(run[s][0] for s in steps)
    bases = tuple(base[s][0] for s in steps)
    limits = tuple(lr_limit(run[s][0], base[s][0], run[s][1], base[s][1]) for s in steps)
    diffs = [abs(r - b) for r, b in zip(runs, bases)]
    diverging = [s for s, d, lim in zip(steps, diffs, limits) if d > lim]
    worst = max(range(len(steps)), key=lambda i: diffs[i])
    return LrVerdict(ok=not diverging, steps=steps, run_lrs=runs, base_lrs=bases, limits=limits,
                     first_diverging_step=diverging[0] if diverging else None,
                     worst_step=steps[worst], max_abs_diff=diffs[worst], problem=None)
