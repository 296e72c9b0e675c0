"""The diff of a run against its single-device reference: the loss of every step and every
parameter's gradient file, element-wise `|got - ref| <= atol + rtol * |ref|`.

Non-finite values in the run are mismatches (NaN never compares equal); missing and extra
gradient names and shape changes are failures of their own. Plain numpy, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.cases import Tolerance

from .locate import Locator, layer_of


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

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing or self.extra)

    def to_dict(self) -> dict:
        return {"tolerance": self.tolerance.to_dict(), "steps": self.steps,
                "compared": self.compared, "mismatched": len(self.mismatched),
                "mismatched_steps": self.mismatched, "nonfinite_steps": self.nonfinite,
                "missing_steps": self.missing, "extra_steps": self.extra,
                "max_abs_diff": _json_float(self.max_abs_diff),
                "first_diverging_step": self.first[0] if self.first else None,
                "ok": self.ok}


def compare_losses(got: list[dict], ref: list[dict], tol: Tolerance) -> LossDiff:
    """`got` and `ref` are step records ({"step", "loss", ...})."""
    got_by_step = {int(r["step"]): float(r["loss"]) for r in got}
    ref_by_step = {int(r["step"]): float(r["loss"]) for r in ref}
    diff = LossDiff(tolerance=tol, steps=len(ref_by_step))
    diff.extra = sorted(set(got_by_step) - set(ref_by_step))
    for step in sorted(ref_by_step):
        ref_loss = ref_by_step[step]
        if step not in got_by_step:
            diff.missing.append(step)
            continue
        got_loss = got_by_step[step]
        diff.compared += 1
        if not math.isfinite(got_loss):
            diff.nonfinite.append(step)
        else:
            diff.max_abs_diff = max(diff.max_abs_diff, abs(got_loss - ref_loss))
        if not within(got_loss, ref_loss, tol):
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

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "elements": self.elements,
                "mismatched": self.mismatched, "nonfinite": self.nonfinite,
                "max_abs_diff": _json_float(self.max_abs_diff),
                "worst_index": list(self.worst_index), "worst_got": _json_float(self.worst_got),
                "worst_ref": _json_float(self.worst_ref), "stage": self.stage,
                "layer": self.layer}


@dataclass
class GradientDiff:
    tolerance: Tolerance
    parameters: int = 0  # names in the reference
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    shape_errors: list[str] = field(default_factory=list)
    diffs: list[ParameterDiff] = field(default_factory=list)  # every compared parameter

    @property
    def mismatched(self) -> list[ParameterDiff]:
        return [d for d in self.diffs if d.mismatched]

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
        return not (self.missing or self.extra or self.shape_errors or self.mismatched)

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
                "worst": [d.to_dict() for d in self.worst(worst)],
                "per_layer": self.per_layer(), "ok": self.ok}


_PART_ORDER = {"embedding": 0, "final_norm": 2, "head": 3, "other": 4}


def _layer_rank(layer: int | str) -> tuple[int, int]:
    return (1, layer) if isinstance(layer, int) else (_PART_ORDER[layer], 0)


def gradient_names(directory: str | Path) -> list[str]:
    return sorted(p.name[:-4] for p in Path(directory).glob("*.npy") if not p.name.startswith("."))


def compare_gradients(got_dir: str | Path, ref_dir: str | Path, tol: Tolerance,
                      locator: Locator | None = None) -> GradientDiff:
    got_dir, ref_dir = Path(got_dir), Path(ref_dir)
    got_names = set(gradient_names(got_dir)) if got_dir.is_dir() else set()
    ref_names = gradient_names(ref_dir)
    diff = GradientDiff(tolerance=tol, parameters=len(ref_names))
    diff.missing = [n for n in ref_names if n not in got_names]
    diff.extra = sorted(got_names - set(ref_names))
    for name in ref_names:
        if name not in got_names:
            continue
        ref = np.load(ref_dir / f"{name}.npy").astype(np.float64)
        try:  # the run's file may be cut short or junk: a failure naming it, not an error
            got = np.load(got_dir / f"{name}.npy", allow_pickle=False).astype(np.float64)
        except (OSError, ValueError, EOFError) as error:
            diff.shape_errors.append(f"{name}: the run's gradient file cannot be read ({error})")
            continue
        if got.shape != ref.shape:
            diff.shape_errors.append(f"{name}: shape {tuple(got.shape)}, reference {tuple(ref.shape)}")
            continue
        parameter = _diff_arrays(name, got, ref, tol)
        if locator is not None:
            parameter.stage, parameter.layer = locator.locate(name)
            parameter.stages = locator.stages(name)
        diff.diffs.append(parameter)
    return diff


def _diff_arrays(name: str, got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> ParameterDiff:
    delta = np.abs(got - ref)
    allowed = tol.atol + tol.rtol * np.abs(ref)
    bad = ~(delta <= allowed)
    finite = np.isfinite(got)
    excess = np.where(np.isfinite(delta), delta - allowed, np.inf)
    flat = int(np.argmax(excess)) if excess.size else 0
    index = tuple(int(i) for i in np.unravel_index(flat, got.shape)) if got.size else ()
    finite_delta = delta[np.isfinite(delta)]
    return ParameterDiff(
        name=name, shape=tuple(got.shape), elements=int(got.size), mismatched=int(bad.sum()),
        nonfinite=int((~finite).sum()),
        max_abs_diff=float(finite_delta.max()) if finite_delta.size else 0.0,
        worst_excess=float(excess.flat[flat]) if excess.size else 0.0,
        worst_index=index, worst_got=float(got.flat[flat]) if got.size else 0.0,
        worst_ref=float(ref.flat[flat]) if ref.size else 0.0,
    )


def _json_float(value: float):
    """JSON has no NaN / inf: write them as strings."""
    return value if math.isfinite(value) else str(value)
