"""The scale-free verdict, beside the element-wise `|got - ref| <= atol + rtol * |ref|`.

Gradients: per parameter the relative error `||got - ref||_2 / ||ref||_2` (a zero reference
norm gives 0 when the run is exactly zero too, else inf). Scaling every gradient of a stage by
(1 + e) gives exactly e, whatever the size of the gradients, so its power does not shrink as
models grow (the element-wise atol does: it sees e * max|g|).

Loss: `|got - ref| / max(|ref|, LOSS_SCALE_FLOOR)` per step. The loss of a language model is
an average cross-entropy of order ln(vocab) (10.8 for GPT-2's 50304 tokens, 6.2 for the tiny
preset's 512) whatever the width or depth, and rounding moves it in proportion to its size,
so the relative difference is the scale-free one. (The step's loss *change* was considered and
rejected: at the learning rates of the precision configs it is 1e-4..1e-2 and changes sign, so a
difference measured against it would divide noise by noise.) The floor keeps a loss that
approaches zero from turning rounding into a failure. Below the print resolution nothing is
judged: a loss parsed from a printed line (InfiniTrain's `{:.6f}`) carries `loss_resolution`, and
a difference within it is not counted by either loss verdict (diff.compare_losses).

A case fails when EITHER verdict fails: the element-wise check (InfiniTrain's, kept for
compatibility) or the scale-free one. The margin is `threshold / worst` (how many times below
the threshold the worst value is: > 1 passes, < 1 fails, inf when the worst is exactly 0).

Thresholds per dtype, chosen from measured noise (docs/verdicts.md "Numerics"; the
measurements and commands are in docs/benchmarks.md#numerics). Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_SCALE_FLOOR = 1.0


@dataclass(frozen=True)
class RelativeThresholds:
    """Largest scale-free error that passes: loss (relative to the loss) and per-parameter
    gradient (relative to the reference gradient's norm)."""

    loss: float
    gradients: float

    def to_dict(self) -> dict:
        return {"loss": self.loss, "gradients": self.gradients}


# From the measured noise floor (benchmarks/noise_floor.py over the CPU sessions of the basic
# and pipeline_layout tags, tiny preset; docs/benchmarks.md#noise-floor):
#   float32: worst gradient ||d||/||ref|| 1.61e-7 (TP2+SP) -> 1e-5, 62x above the noise and 10x
#            below the 1e-4 stage bug to be caught.
#            Loss: 1e-5. The CPU noise is 2.14e-8 (8.83e-8 at a 124M shape), but on 2 x H200 a GPT-2
#            124M PP `4,8` run moved the loss by up to 2e-6 against one GPU: the old 1e-6 passed
#            that only above a loss of 2, and a fine-tuned 124M sits at 1.5..3. 1e-5 passes
#            it with 5x to spare at a loss of 1 (50x at 10.8), is InfiniTrain's own fp32 threshold
#            (scripts/compare_loss.py, absolute) at a loss of 1, and is 10x the 1e-6 print resolution
#            of InfiniTrain's 6-decimal loss (below which nothing can be judged; diff.compare_losses
#            floors every threshold there).
#   bfloat16: worst gradient 2.18e-3 (TP2), worst loss 7.35e-6 (TP2, 8 cases of basic and
#            schedules) -> 2e-2 and 1e-4, 9.2x and 13.6x above.
# At a GPT-2 124M shape (CPU, synthetic weights) the fp32 TP2 noise was 6.06e-7 / 8.83e-8: 16x
# and 113x below; the bf16 TP2 noise 4.81e-3 / 5.09e-5: 4.2x and only 2.0x below (measure bf16
# on the GPU before trusting 1e-4 there).
DEFAULT_RELATIVE = {
    "float32": RelativeThresholds(loss=1e-5, gradients=1e-5),
    "bfloat16": RelativeThresholds(loss=1e-4, gradients=2e-2),
}


# Parameter updates (final - initial, --dump_parameter_updates): the subtraction cancels, so an
# update is only as exact as float32's rounding of the parameter itself (6e-8 x |p|). Measured:
# 1.7e-5 worst on the tiny preset (SGD, lr 1e-3, 3 steps, PP2); 1e-3 keeps 60x from that and still
# sees an optimizer that skips a parameter (1.0) or a reduction done on step 1 only (>= 1/steps).
UPDATE_RELATIVE = {"float32": 1e-3, "bfloat16": 2e-2}
# ... and below that rounding a relative error means nothing: LayerNorm / RMSNorm weights sit
# near 1.0, where float32 steps by 2**-23, so a norm weight's update of a few steps is known only
# to about two such steps per element. Measured: bf16 PP2 / TP2 runs of the tiny preset moved
# h.1.ln_2.weight's update (norm 4.2e-6 over 32 elements) by one step, 1.19e-7: a relative error
# of 0.028 out of pure rounding. A difference within RESOLUTION per element (as a norm:
# RESOLUTION * sqrt(elements)) is not counted; an update a bug skips is >= 1e-6 per element at the
# precision configs' learning rates (docs/verdicts.md), so it still fails.
UPDATE_RESOLUTION = 2 * 2.0**-23


def _of_dtype(table: dict, dtype: str | None, what: str):
    """`table`'s entry for a case's --dtype (None: the flag's default, float32). The config
    loader admits only harness.contracts.flags.DTYPES, so another name is a programming error: it is
    refused, not quietly judged with another dtype's thresholds."""
    key = dtype or "float32"
    if key not in table:
        raise ValueError(f"no {what} for --dtype {dtype!r}: expected one of {sorted(table)}")
    return table[key]


def update_threshold(dtype: str | None) -> float:
    """The scale-free threshold on ||got - ref|| / ||ref|| of each parameter's change."""
    return _of_dtype(UPDATE_RELATIVE, dtype, "parameter-update threshold")


def relative_thresholds(dtype: str | None) -> RelativeThresholds:
    """The default scale-free thresholds of a dtype (None: float32)."""
    return _of_dtype(DEFAULT_RELATIVE, dtype, "scale-free thresholds")


def relative_error(diff_norm: float, ref_norm: float, floor: float = 0.0) -> float:
    """||got - ref|| / ||ref||, the difference less `floor` (the rounding of the values
    compared, as a norm); NaN in the run gives inf (never passes)."""
    if not (math.isfinite(diff_norm) and math.isfinite(ref_norm)):
        return math.inf
    diff_norm = max(diff_norm - floor, 0.0)
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def loss_relative_error(got: float, ref: float) -> float:
    if not (math.isfinite(got) and math.isfinite(ref)):
        return math.inf
    return abs(got - ref) / max(abs(ref), LOSS_SCALE_FLOOR)


def passes(error: float, threshold: float) -> bool:
    return error <= threshold  # False for NaN


def margin(threshold: float, worst: float) -> float:
    """threshold / worst: how many times below the threshold the worst value is."""
    if not math.isfinite(worst):
        return 0.0
    if worst <= 0.0:
        return math.inf
    return threshold / worst
