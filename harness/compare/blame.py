"""Which module a step's error comes from: every replayed module call's local error (the
subject's distance from the partner module run in float64 on the subject's own inputs,
harness.contracts.replay) against that call's own floor (the partner's distance in the
subject's dtype on the same inputs, times a factor). The first call in the subject's execution
order whose local error is over its floor is the blamed one, whatever happened upstream: unlike
a trace's accumulated differences (harness.compare.trace), a local error does not carry what
the modules before it added. Plain Python, no torch.

A backward row is the gradient of a module's output, written by the backward of the modules
that consumed that output (its row's `consumers`): blaming it blames their backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.contracts.replay import ReplayRow


@dataclass(frozen=True)
class BlameThresholds:
    """A call's floor: max(factor x the dtype replay's error, min_relative x the float64
    replay's largest value). `source` names the measurement that chose them."""
    factor: float
    min_relative: float
    source: str

    def __post_init__(self) -> None:
        for name, value in (("factor", self.factor), ("min_relative", self.min_relative)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"blame threshold {name} is {value!r}; expected a finite "
                                 f"number > 0")

    def floor(self, row: ReplayRow) -> float:
        return max(self.factor * row.floor_error, self.min_relative * row.scale)


@dataclass(frozen=True)
class Judged:
    row: ReplayRow
    floor: float | None  # None: not replayed (row.note says why)

    @property
    def over(self) -> bool:
        if self.floor is None:
            return False
        error = self.row.subject_error
        return math.isnan(error) or error > self.floor

    @property
    def ratio(self) -> float | None:
        if self.floor is None:
            return None
        return math.inf if self.floor == 0 else self.row.subject_error / self.floor

    def relative(self, value: float) -> float:
        scale = self.row.scale or 0.0
        return value / scale if scale > 0 else (0.0 if value == 0 else math.inf)

    def describe(self) -> str:
        """One line: what was replayed, its local error over its floor."""
        row = self.row
        if self.floor is None:
            return f"{row.label}: not replayed: {row.note}"
        where = (f"{row.module} forward" + (f" (call {row.index})" if row.index else "")
                 + ", run on the subject's own inputs" + _inputs(row))
        if row.phase == "backward":
            writers = ", ".join(row.consumers) or "the loss"
            where = (f"the gradient of {row.module}'s output" +
                     (f" (call {row.index})" if row.index else "") +
                     f", written by {writers}'s backward")
        return (f"{where}: local error {self.relative(row.subject_error):.2g} relative "
                f"(max |d| {row.subject_error:.2g} at a max of {row.scale:.2g}), floor "
                f"{self.relative(self.floor):.2g}" + (" <- blamed" if self.over else ""))


def _inputs(row: ReplayRow) -> str:
    """` (its input: h.0.attn.c_attn's output through h.0.attn's own code)` for a forward row
    whose input the partner's inline code built: blaming it blames that code too."""
    if not row.inputs:
        return ""
    sources = ", ".join(f"{name}'s" for name in row.inputs)
    if not row.inline:
        return f" ({sources} output)"
    parts = row.module.split(".")
    owner = ".".join(parts[:-1]) if len(parts) > 1 else "the model"
    return f" ({sources} output through {owner}'s own code before it)"


@dataclass(frozen=True)
class Blame:
    judged: tuple[Judged, ...]
    thresholds: BlameThresholds

    @property
    def blamed(self) -> Judged | None:
        return next((j for j in self.judged if j.over), None)

    @property
    def not_replayed(self) -> tuple[Judged, ...]:
        return tuple(j for j in self.judged if j.floor is None)

    def summary(self) -> str:
        """The blame in one line."""
        blamed = self.blamed
        replayed = len(self.judged) - len(self.not_replayed)
        if blamed is None:
            return (f"no module over its floor: {replayed} module calls replayed on the "
                    f"subject's own inputs, each within {self.thresholds.factor:g} x the "
                    f"partner's own {'rounding'} there")
        return f"blamed: {blamed.describe()}"


def judge(rows: tuple[ReplayRow, ...] | list[ReplayRow],
          thresholds: BlameThresholds) -> Blame:
    """Each row against its floor, in the subject's execution order (the rows' `order`)."""
    ordered = sorted(rows, key=lambda r: r.order)
    return Blame(tuple(Judged(r, None if r.note is not None else thresholds.floor(r))
                       for r in ordered), thresholds)


# A call's floor per subject dtype. float32: measured on real InfiniTrain CPU builds (master
# b24d92f and feat/add_Qwen3-8B a3f84f8: gpt2, llama3 and qwen3 on the `infinitrain` preset,
# step 1; docs/benchmarks.md#module-replay): every clean call's local error within 1.76 x the
# bundled model's own float32 error on the same inputs, and zero where that is zero, so the
# worst clean call sits at 0.11 of a floor of 16 x, whatever the relative minimum from 1e-6 down
# to 5e-8. min_relative 1e-7 (under two float32 roundings, 2^-24 each, of the call's largest
# value) is the floor of calls the float32 replay computes exactly; at 1e-6 a cross-entropy
# backward off by 1e-4 in its softmax term went unblamed. bfloat16 is not measured.
REPLAY_THRESHOLDS = {
    "float32": BlameThresholds(16.0, 1e-7, "docs/benchmarks.md#module-replay: clean InfiniTrain "
                                           "calls within 1.76 x the bundled float32 replay's "
                                           "own error, at 0.11 of this floor"),
}
