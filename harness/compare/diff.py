"""The diff of a run against its single-device reference: the loss of every step and every
parameter's gradient file, element-wise `|got - ref| <= atol + rtol * |ref|` (InfiniTrain's
check, kept for compatibility) and scale-free (`verdict.py`: per parameter
`||got - ref|| / ||ref||`, per step `|got - ref| / max(|loss|, 1)`); a comparison passes when both
do (the scale-free one only where a threshold is given).

Each gradient file is read once, in blocks that stay in cache, and every statistic of both
verdicts is computed in that one pass (`fastdiff.py`).

Non-finite values in the run are mismatches (NaN never compares equal); missing and extra
gradient names and shape changes are failures of their own. A loss difference within the
print resolution of the step (`loss_resolution` of a printed loss: 1e-6 for 6 decimals) is not
counted by either loss verdict. Plain numpy, no torch.

Under tensor parallelism (`tensor_parallel` > 1) a sharded parameter's file is one TP rank's
un-gathered slice: a file whose shape differs from the reference's is compared with the TP slice
of the reference that fits it best (`tp_shards.match_shard`), and the record names that slice
(`shard`); a file of the reference's shape (a replicated parameter) is compared whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.contracts.tolerance import Tolerance  # any object with atol / rtol does

from .fastdiff import FileStats, ShapeError, UnreadableError, _load_got, diff_files, exact_stats
from .locate import Locator, layer_of
from .tp_shards import fused_qkv_groups, match_shard
from .verdict import loss_relative_error, margin, passes, relative_error


def within(got: float, ref: float, tol: Tolerance) -> bool:
    return abs(got - ref) <= tol.atol + tol.rtol * abs(ref)  # False for NaN


@dataclass
class LossDiff:
    tolerance: Tolerance
    steps: int  # steps in the reference
    compared: int = 0
    mismatched: list[int] = field(default_factory=list)  # step numbers
    nonfinite: list[int] = field(default_factory=list)  # steps whose loss is NaN / inf in the run
    missing: list[int] = field(default_factory=list)  # reference steps the run did not record
    extra: list[int] = field(default_factory=list)
    max_abs_diff: float = 0.0
    first: tuple[int, float, float] | None = None  # (step, got, ref) of the first mismatch
    relative_threshold: float | None = None  # the scale-free verdict's; None: not applied
    worst_relative: float = 0.0  # max over steps of |got - ref| / max(|ref|, 1), as counted
    worst_relative_step: int | None = None
    # The coarsest print resolution of a compared step (the coarser of the run's and the
    # reference's `loss_resolution`; 0: both at full precision) ...
    resolution: float = 0.0
    # ... and the steps whose non-zero difference was within theirs: not counted by either verdict
    within_resolution: list[int] = field(default_factory=list)

    @property
    def relative_ok(self) -> bool:
        return self.relative_threshold is None or passes(self.worst_relative,
                                                         self.relative_threshold)

    @property
    def elementwise_ok(self) -> bool:
        return not (self.mismatched or self.missing or self.extra)

    @property
    def ok(self) -> bool:
        return self.elementwise_ok and self.relative_ok

    def relative_dict(self) -> dict | None:
        if self.relative_threshold is None:
            return None
        return {"threshold": self.relative_threshold,
                "worst": _json_float(self.worst_relative), "worst_step": self.worst_relative_step,
                "margin": _json_float(margin(self.relative_threshold, self.worst_relative)),
                "ok": self.relative_ok}

    def to_dict(self) -> dict:
        return {"tolerance": self.tolerance.to_dict(), "steps": self.steps,
                "compared": self.compared, "mismatched": len(self.mismatched),
                "mismatched_steps": self.mismatched, "nonfinite_steps": self.nonfinite,
                "missing_steps": self.missing, "extra_steps": self.extra,
                "max_abs_diff": _json_float(self.max_abs_diff),
                "first_diverging_step": self.first[0] if self.first else None,
                "resolution": self.resolution,
                "within_resolution_steps": self.within_resolution,
                "elementwise_ok": self.elementwise_ok, "relative": self.relative_dict(),
                "ok": self.ok}


# Printed losses are decimals parsed into float64: a one-unit difference of 6-decimal prints
# comes out as 1.0000000000287557e-06, not 1e-06 (float64's spacing at a loss of 11 is 1.8e-15,
# 2e-9 of a unit). The slack takes that repr error, nothing a bug could hide in.
RESOLUTION_SLACK = 1e-6


def loss_resolution(record: dict) -> float:
    """A step record's `loss_resolution` (one unit in the last printed place); 0 where the loss
    is at full precision (steps.jsonl of the bundled trainer: no field) or not a number."""
    value = record.get("loss_resolution")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


def compare_losses(got: list[dict], ref: list[dict], tol: Tolerance,
                   relative: float | None = None) -> LossDiff:
    """`got` and `ref` are step records ({"step", "loss", ...}); `relative` is the scale-free
    threshold (None: element-wise only).

    Print resolution: per step the coarser of the two records' `loss_resolution` (a trainer
    that prints its loss with 6 decimals: 1e-6); a difference within it is not counted by
    either verdict (both the atol and the scale-free threshold are floored at one unit in the
    last printed place), since two equal runs can differ by that much in print."""
    got_by_step = {int(r["step"]): r for r in got}
    ref_by_step = {int(r["step"]): r for r in ref}
    diff = LossDiff(tolerance=tol, steps=len(ref_by_step), relative_threshold=relative)
    diff.extra = sorted(set(got_by_step) - set(ref_by_step))
    for step in sorted(ref_by_step):
        ref_loss = float(ref_by_step[step]["loss"])
        if step not in got_by_step:
            diff.missing.append(step)
            continue
        got_loss = float(got_by_step[step]["loss"])
        diff.compared += 1
        resolution = max(loss_resolution(got_by_step[step]), loss_resolution(ref_by_step[step]))
        diff.resolution = max(diff.resolution, resolution)
        delta = abs(got_loss - ref_loss)  # NaN where either is NaN: never within
        printed_equal = delta <= resolution * (1 + RESOLUTION_SLACK)
        if printed_equal and delta > 0:
            diff.within_resolution.append(step)
        error = 0.0 if printed_equal else loss_relative_error(got_loss, ref_loss)
        if diff.worst_relative_step is None or error > diff.worst_relative:
            diff.worst_relative, diff.worst_relative_step = error, step
        if not math.isfinite(got_loss):
            diff.nonfinite.append(step)
        else:
            diff.max_abs_diff = max(diff.max_abs_diff, delta)
        if not printed_equal and not within(got_loss, ref_loss, tol):
            diff.mismatched.append(step)
            if diff.first is None:
                diff.first = (step, got_loss, ref_loss)
    return diff


@dataclass
class ParameterDiff:
    name: str
    shape: tuple[int, ...]
    elements: int
    mismatched: int
    nonfinite: int
    max_abs_diff: float  # over finite elements
    worst_excess: float  # max of |d| - allowed (inf where the run is not finite)
    worst_index: tuple[int, ...]
    worst_got: float
    worst_ref: float
    stage: str = "?"
    layer: str = "-"
    stages: tuple[int, ...] = ()  # what `stage` says, as numbers (for the per-layer summary)
    ref_norm: float = 0.0  # ||ref||_2
    got_norm: float = 0.0  # ||got||_2 (inf / nan where the run is not finite)
    diff_norm: float = 0.0  # ||got - ref||_2
    resolution: float = 0.0  # per element: differences this small are rounding, not counted
    shard: str | None = None  # TP: the reference slice the run's file was compared with

    @property
    def relative_error(self) -> float:
        """||got - ref|| / ||ref|| (inf where the run is not finite), the difference less the
        values' rounding (resolution * sqrt(elements))."""
        if self.nonfinite:
            return math.inf
        return relative_error(self.diff_norm, self.ref_norm,
                              self.resolution * math.sqrt(self.elements))

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "elements": self.elements,
                "mismatched": self.mismatched, "nonfinite": self.nonfinite,
                "max_abs_diff": _json_float(self.max_abs_diff),
                "relative_error": _json_float(self.relative_error),
                "worst_index": list(self.worst_index), "worst_got": _json_float(self.worst_got),
                "worst_ref": _json_float(self.worst_ref), "stage": self.stage,
                "layer": self.layer, **({"shard": self.shard} if self.shard else {})}

    def summary(self) -> dict:
        """What the record keeps of every parameter (the dump itself may be deleted)."""
        return {"name": self.name, "ref_norm": _json_float(self.ref_norm),
                "got_norm": _json_float(self.got_norm),
                "diff_norm": _json_float(self.diff_norm),
                "relative_error": _json_float(self.relative_error),
                "max_abs_diff": _json_float(self.max_abs_diff), "mismatched": self.mismatched}


@dataclass
class GradientDiff:
    tolerance: Tolerance
    parameters: int = 0  # names in the reference
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    shape_errors: list[str] = field(default_factory=list)
    diffs: list[ParameterDiff] = field(default_factory=list)  # every compared parameter
    relative_threshold: float | None = None  # the scale-free verdict's; None: not applied
    tensor_parallel: int = 1  # > 1: sharded files were compared with their TP slice

    @property
    def tp_slices(self) -> int:
        """Parameters compared as a TP rank's slice of the reference."""
        return sum(1 for d in self.diffs if d.shard)

    @property
    def mismatched(self) -> list[ParameterDiff]:
        return [d for d in self.diffs if d.mismatched]

    @property
    def relative_failures(self) -> list[ParameterDiff]:
        """Parameters over the scale-free threshold, worst first."""
        if self.relative_threshold is None:
            return []
        bad = [d for d in self.diffs if not passes(d.relative_error, self.relative_threshold)]
        return sorted(bad, key=lambda d: (-d.relative_error, d.name))

    @property
    def worst_relative(self) -> ParameterDiff | None:
        return max(self.diffs, key=lambda d: (d.relative_error, d.name), default=None)

    @property
    def relative_ok(self) -> bool:
        return not self.relative_failures

    @property
    def elementwise_ok(self) -> bool:
        return not (self.missing or self.extra or self.shape_errors or self.mismatched)

    def relative_dict(self) -> dict | None:
        if self.relative_threshold is None:
            return None
        worst = self.worst_relative
        value = worst.relative_error if worst else 0.0
        return {"threshold": self.relative_threshold, "worst": _json_float(value),
                "worst_parameter": worst.name if worst else None,
                "worst_stage": worst.stage if worst else None,
                "margin": _json_float(margin(self.relative_threshold, value)),
                "failed": [d.name for d in self.relative_failures], "ok": self.relative_ok}

    @property
    def elements(self) -> int:
        return sum(d.elements for d in self.diffs)

    @property
    def mismatched_elements(self) -> int:
        return sum(d.mismatched for d in self.diffs)

    @property
    def max_abs_diff(self) -> float:
        return max((d.max_abs_diff for d in self.diffs), default=0.0)

    @property
    def ok(self) -> bool:
        return self.elementwise_ok and self.relative_ok

    def worst(self, n: int = 5) -> list[ParameterDiff]:
        ranked = sorted(self.mismatched or self.diffs, key=lambda d: (-d.worst_excess, d.name))
        return ranked[:n]

    def per_layer(self) -> list[dict]:
        """Every compared parameter summed up by where it lives, in model order: "embedding",
        the transformer layers (int), "final_norm", "head" (and "other" for unknown names):
        {layer, stage, max_abs_diff, mismatched (parameters), parameters}."""
        groups: dict[object, list[ParameterDiff]] = {}
        for d in self.diffs:
            groups.setdefault(layer_of(d.name), []).append(d)
        rows = []
        for layer in sorted(groups, key=_layer_rank):
            members = groups[layer]
            stages = list(dict.fromkeys(str(s) for d in members for s in d.stages))
            rows.append({"layer": layer, "stage": "+".join(stages) or "?",
                         "max_abs_diff": _json_float(max(d.max_abs_diff for d in members)),
                         "mismatched": sum(1 for d in members if d.mismatched),
                         "parameters": len(members)})
        return rows

    def to_dict(self, worst: int = 10) -> dict:
        return {"tolerance": self.tolerance.to_dict(), "parameters": self.parameters,
                "mismatched": len(self.mismatched), "elements": self.elements,
                "mismatched_elements": self.mismatched_elements,
                "max_abs_diff": _json_float(self.max_abs_diff), "missing": self.missing,
                "extra": self.extra, "shape_errors": self.shape_errors,
                **({"tp_slices": self.tp_slices} if self.tensor_parallel > 1 else {}),
                "worst": [d.to_dict() for d in self.worst(worst)],
                "per_layer": self.per_layer(), "elementwise_ok": self.elementwise_ok,
                "relative": self.relative_dict(),
                "per_parameter": [d.summary() for d in self.diffs], "ok": self.ok}


_PART_ORDER = {"embedding": 0, "final_norm": 2, "head": 3, "other": 4}


def _layer_rank(layer: int | str) -> tuple[int, int]:
    return (1, layer) if isinstance(layer, int) else (_PART_ORDER[layer], 0)


def gradient_names(directory: str | Path) -> list[str]:
    """The parameter names of a dump folder; dot files are a writer's temporaries, not
    parameters."""
    return sorted(p.name[:-4] for p in Path(directory).glob("*.npy") if not p.name.startswith("."))


def compare_gradients(got_dir: str | Path, ref_dir: str | Path, tol: Tolerance,
                      locator: Locator | None = None,
                      relative: float | None = None, resolution: float = 0.0,
                      tensor_parallel: int = 1) -> GradientDiff:
    """Every reference gradient file against the run's; `relative` is the scale-free threshold
    on `||got - ref|| / ||ref||` per parameter (None: element-wise only); `resolution` the
    per-element rounding of the values compared, not counted in it (parameter updates);
    `tensor_parallel` > 1: a file of another shape than the reference's is one TP rank's
    un-gathered slice, compared with the slice of the reference that fits it best."""
    got_dir, ref_dir = Path(got_dir), Path(ref_dir)
    got_names = set(gradient_names(got_dir))  # none when the run wrote no folder
    ref_names = gradient_names(ref_dir)
    diff = GradientDiff(tolerance=tol, parameters=len(ref_names), relative_threshold=relative,
                        tensor_parallel=tensor_parallel)
    diff.missing = [n for n in ref_names if n not in got_names]
    diff.extra = sorted(got_names - set(ref_names))
    for name in ref_names:
        if name not in got_names:
            continue
        try:  # the run's file may be cut short or junk: a failure naming it, not an error
            stats = diff_files(got_dir / f"{name}.npy", ref_dir / f"{name}.npy",
                               tol.atol, tol.rtol)
        except UnreadableError as error:
            diff.shape_errors.append(f"{name}: the run's gradient file cannot be read ({error})")
            continue
        except ShapeError as error:
            shard = None
            if tensor_parallel > 1:
                try:
                    shard = _tp_shard(got_dir, ref_dir, name, tensor_parallel)
                except UnreadableError as unreadable:
                    diff.shape_errors.append(
                        f"{name}: the run's gradient file cannot be read ({unreadable})")
                    continue
            if shard is None:
                diff.shape_errors.append(f"{name}: {error}")
                continue
            stats = exact_stats(shard.compared, shard.reference, tol.atol, tol.rtol)
        else:
            shard = None
        parameter = _parameter(name, stats)
        if shard is not None:
            parameter.shard = shard.describe()
        parameter.resolution = resolution
        if locator is not None:
            parameter.stage, parameter.layer = locator.locate(name)
            parameter.stages = locator.stages(name)
        diff.diffs.append(parameter)
    return diff


def _tp_shard(got_dir: Path, ref_dir: Path, name: str, tp: int):
    """The TP slice of the reference the run's file of `name` holds (None: none fits). The
    fused c_attn's q / k / v groups come from its weight's reference shape (GQA-aware)."""
    got = _load_got(got_dir / f"{name}.npy")
    ref = np.load(ref_dir / f"{name}.npy", allow_pickle=False)
    groups = None
    if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
        weight = ref_dir / f"{name.rsplit('.', 1)[0]}.weight.npy"
        if weight.exists():
            groups = fused_qkv_groups(tuple(np.load(weight, mmap_mode="r").shape))
    return match_shard(got, ref, tp, groups)


def _parameter(name: str, s: FileStats) -> ParameterDiff:
    return ParameterDiff(
        name=name, shape=s.shape, elements=s.elements, mismatched=s.mismatched,
        nonfinite=s.nonfinite, max_abs_diff=s.max_abs_diff, worst_excess=s.worst_excess,
        worst_index=s.worst_index, worst_got=s.worst_got, worst_ref=s.worst_ref,
        ref_norm=s.ref_norm, got_norm=s.got_norm, diff_norm=s.diff_norm)


def _json_float(value: float):
    """JSON has no NaN / inf: write them as strings."""
    return value if math.isfinite(value) else str(value)
