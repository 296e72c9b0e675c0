"""Failure text of a diff, in the manner of pytest's approx: mismatched k of n, the first
diverging step, the worst parameters with their differences, stage and layer."""

from __future__ import annotations

from tabulate import tabulate

from .diff import GradientDiff, LossDiff
from .verdict import margin


def _g(value: float) -> str:
    return f"{value:.6g}"


def loss_lines(diff: LossDiff) -> list[str]:
    lines = []
    if diff.nonfinite:
        lines.append(f"loss is not finite (NaN / inf) at step(s) {_steps(diff.nonfinite)}")
    if diff.missing:
        lines.append(f"the run recorded no loss for step(s) {_steps(diff.missing)} "
                     f"of the reference's {diff.steps}")
    if diff.extra:
        lines.append(f"the run recorded step(s) {_steps(diff.extra)} the reference does not have")
    if diff.mismatched:
        step, got, ref = diff.first
        lines.append(f"loss: mismatched {len(diff.mismatched)} of {diff.compared} steps "
                     f"({diff.tolerance}); first diverging step {step}: "
                     f"got {_g(got)}, reference {_g(ref)}, |diff| {_g(abs(got - ref))}")
    elif diff.compared:
        lines.append(f"loss: {diff.compared} of {diff.compared} steps within {diff.tolerance} "
                     f"(max |diff| {_g(diff.max_abs_diff)})")
    if diff.relative_threshold is not None and diff.compared:
        verdict = "within" if diff.relative_ok else "OVER"
        lines.append(f"loss (scale-free): worst |got-ref|/max(|ref|,1) {_g(diff.worst_relative)} "
                     f"at step {diff.worst_relative_step}, {verdict} the threshold "
                     f"{_g(diff.relative_threshold)} (margin "
                     f"{_g(margin(diff.relative_threshold, diff.worst_relative))}x)")
    return lines


def gradient_lines(diff: GradientDiff, worst: int = 5) -> list[str]:
    lines = []
    if diff.missing:
        lines.append(f"gradients: {len(diff.missing)} missing from the run: "
                     + ", ".join(diff.missing[:10]) + (" ..." if len(diff.missing) > 10 else ""))
    if diff.extra:
        lines.append(f"gradients: {len(diff.extra)} not in the reference: "
                     + ", ".join(diff.extra[:10]) + (" ..." if len(diff.extra) > 10 else ""))
    for error in diff.shape_errors:
        lines.append(f"gradients: {error}")
    bad = diff.mismatched
    if bad:
        nonfinite = sum(d.nonfinite for d in bad)
        lines.append(
            f"gradients: mismatched {len(bad)} of {len(diff.diffs)} parameters "
            f"({diff.mismatched_elements} of {diff.elements} elements; {diff.tolerance})"
            + (f"; {nonfinite} elements are NaN / inf in the run" if nonfinite else ""))
        rows = [[d.name, d.stage, d.layer, f"{d.mismatched}/{d.elements}",
                 _g(d.max_abs_diff), list(d.worst_index), _g(d.worst_got), _g(d.worst_ref)]
                for d in diff.worst(worst)]
        table = tabulate(rows, headers=["parameter", "stage", "layer", "mismatched",
                                        "max |got-ref|", "at", "got", "ref"])
        lines.append(f"worst parameters:\n{table}")
    elif diff.diffs:
        lines.append(f"gradients: {len(diff.diffs)} of {diff.parameters} parameters within "
                     f"{diff.tolerance} (max |diff| {_g(diff.max_abs_diff)})")
    lines += _relative_lines(diff, worst)
    return lines


def _relative_lines(diff: GradientDiff, worst: int) -> list[str]:
    if diff.relative_threshold is None or not diff.diffs:
        return []
    top = diff.worst_relative
    value = top.relative_error
    head = (f"gradients (scale-free): worst ||got-ref||/||ref|| {_g(value)} at {top.name} "
            f"(stage {top.stage}), threshold {_g(diff.relative_threshold)}, margin "
            f"{_g(margin(diff.relative_threshold, value))}x")
    bad = diff.relative_failures
    if not bad:
        return [head]
    rows = [[d.name, d.stage, d.layer, _g(d.relative_error), _g(d.diff_norm), _g(d.ref_norm),
             _g(d.max_abs_diff)] for d in bad[:worst]]
    table = tabulate(rows, headers=["parameter", "stage", "layer", "||got-ref||/||ref||",
                                    "||got-ref||", "||ref||", "max |got-ref|"])
    return [f"{head}: OVER the threshold in {len(bad)} of {len(diff.diffs)} parameters",
            f"worst parameters (scale-free):\n{table}"]


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (" ..." if len(steps) > 10 else "")
