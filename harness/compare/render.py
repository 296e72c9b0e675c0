"""One diff renderer, two outputs: the loss and gradient diffs as plain text (pytest's failure
message, in the manner of approx: mismatched k of n, the first diverging step, the worst
parameters with stage and layer) and as markdown (the report's failures section, from the
summaries a record keeps). Both share the table writer, the cell formats and the
worst-parameters table, so a column added here shows in both.

    loss_lines(LossDiff) / gradient_lines(GradientDiff)           text, from the diff
    loss_markdown(summary) / gradient_markdown(summary)           markdown, from record["loss"] /
                                                                  record["gradients"]
    table(rows, headers, fmt), worst_table(worst, fmt)            the shared pieces
"""

from __future__ import annotations

import math

from tabulate import tabulate

from .diff import GradientDiff, LossDiff
from .verdict import margin

TEXT, MARKDOWN = "text", "markdown"
NA = "–"  # a cell with nothing recorded


# ---------------------------------------------------------------------- cells and tables

def number(value) -> float | None:
    """A float from a record value: numbers, "nan" / "inf" strings; None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def g(value, digits: int = 3) -> str:
    """A number for a report cell: NA when not recorded, NaN / inf spelled out."""
    x = number(value)
    if x is None:
        return NA
    if math.isnan(x):
        return "NaN"
    return f"{x:.{digits}g}"  # inf / -inf as such


def _g(value) -> str:  # full precision for the failure text
    return f"{float(value):.6g}"


def md_escape(text) -> str:
    """Pipes and newlines would break a markdown table row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def tolerance_text(tol) -> str:
    if not isinstance(tol, dict):
        return NA
    atol, rtol = number(tol.get("atol")), number(tol.get("rtol"))
    if atol is None:
        return NA
    return f"atol {atol:g}, rtol {rtol or 0:g}"


def table(rows: list[list], headers: list[str], fmt: str = TEXT) -> list[str]:
    """Text: tabulate's plain columns; markdown: a GitHub pipe table, cells escaped."""
    if fmt == MARKDOWN:
        cells = [[md_escape(c) for c in row] for row in rows]
        return tabulate(cells, headers=[md_escape(h) for h in headers], tablefmt="github",
                        disable_numparse=True).splitlines()
    return tabulate(rows, headers=headers).splitlines()


def worst_table(worst: list[dict], fmt: str = TEXT) -> list[str]:
    """The worst parameters (ParameterDiff.to_dict() entries): where each lives, how many
    elements are out, the largest difference and the element it is at."""
    if fmt == MARKDOWN:
        rows = [[f"`{w.get('name')}`", w.get("stage"), w.get("layer"),
                 f"{w.get('mismatched')}/{w.get('elements')}", g(w.get("max_abs_diff")),
                 w.get("worst_index"), g(w.get("worst_got"), 6), g(w.get("worst_ref"), 6)]
                for w in worst]
        return table(rows, ["parameter", "stage", "layer", "mismatched", "max |Δ|", "at", "got",
                            "ref"], MARKDOWN)
    rows = [[w["name"], w["stage"], w["layer"], f"{w['mismatched']}/{w['elements']}",
             _g(w["max_abs_diff"]), list(w["worst_index"]), _g(w["worst_got"]),
             _g(w["worst_ref"])] for w in worst]
    return table(rows, ["parameter", "stage", "layer", "mismatched", "max |got-ref|", "at", "got",
                        "ref"])


def _some(items: list, fmt: str, limit: int = 10) -> str:
    """The first `limit` of a list of names or steps, and an ellipsis when there are more."""
    shown = [f"`{i}`" for i in items[:limit]] if fmt == MARKDOWN else [str(i) for i in
                                                                        items[:limit]]
    more = (" …" if fmt == MARKDOWN else " ...") if len(items) > limit else ""
    return ", ".join(shown) + more


# ---------------------------------------------------------------------- text (pytest)

def loss_lines(diff: LossDiff) -> list[str]:
    lines = []
    if diff.nonfinite:
        lines.append(f"loss is not finite (NaN / inf) at step(s) {_some(diff.nonfinite, TEXT)}")
    if diff.missing:
        lines.append(f"the run recorded no loss for step(s) {_some(diff.missing, TEXT)} "
                     f"of the reference's {diff.steps}")
    if diff.extra:
        lines.append(f"the run recorded step(s) {_some(diff.extra, TEXT)} the reference does "
                     f"not have")
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
                     + _some(diff.missing, TEXT))
    if diff.extra:
        lines.append(f"gradients: {len(diff.extra)} not in the reference: "
                     + _some(diff.extra, TEXT))
    for error in diff.shape_errors:
        lines.append(f"gradients: {error}")
    bad = diff.mismatched
    if bad:
        nonfinite = sum(d.nonfinite for d in bad)
        lines.append(
            f"gradients: mismatched {len(bad)} of {len(diff.diffs)} parameters "
            f"({diff.mismatched_elements} of {diff.elements} elements; {diff.tolerance})"
            + (f"; {nonfinite} elements are NaN / inf in the run" if nonfinite else ""))
        rows = worst_table([d.to_dict() for d in diff.worst(worst)])
        lines.append("worst parameters:\n" + "\n".join(rows))
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
    lines = table(rows, ["parameter", "stage", "layer", "||got-ref||/||ref||", "||got-ref||",
                         "||ref||", "max |got-ref|"])
    return [f"{head}: OVER the threshold in {len(bad)} of {len(diff.diffs)} parameters",
            "worst parameters (scale-free):\n" + "\n".join(lines)]


# ---------------------------------------------------------------------- markdown (report)

def loss_markdown(loss: dict) -> list[str]:
    """A failed loss comparison's bullet (nothing when it passed or was not made)."""
    if not loss or loss.get("ok") is not False:
        return []
    text = (f"- **loss**: first diverging step **{loss.get('first_diverging_step')}**; "
            f"{loss.get('mismatched')} of {loss.get('compared')} steps out of tolerance "
            f"({tolerance_text(loss.get('tolerance'))}); max |Δ| "
            f"{g(loss.get('max_abs_diff'))}")
    extra = []
    for key, what in (("nonfinite_steps", "NaN / inf at step(s)"),
                      ("missing_steps", "no loss recorded for step(s)"),
                      ("extra_steps", "steps the reference lacks")):
        if loss.get(key):
            extra.append(f"{what} {', '.join(map(str, loss[key][:10]))}")
    return [text + ("; " + "; ".join(extra) if extra else ""), ""]


def gradient_markdown(grads: dict) -> list[str]:
    """A failed gradient comparison: counts, what is missing, where, the worst parameters."""
    if not grads or grads.get("ok") is not False:
        return []
    lines = [f"- **gradients**: {grads.get('mismatched')} of {grads.get('parameters')} "
             f"parameters out of tolerance ({tolerance_text(grads.get('tolerance'))}); "
             f"max |Δ| {g(grads.get('max_abs_diff'))}"]
    for key, what in (("missing", "missing from the run"), ("extra", "not in the reference"),
                      ("shape_errors", "shape changed")):
        if grads.get(key):
            lines.append(f"- **{len(grads[key])} {what}**: {_some(grads[key], MARKDOWN)}")
    worst = [w for w in grads.get("worst") or [] if isinstance(w, dict)]
    if worst:
        stages = sorted({str(w.get("stage")) for w in worst if w.get("mismatched")})
        layers = sorted({str(w.get("layer")) for w in worst if w.get("mismatched")},
                        key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x))
        if stages:
            lines.append(f"- **where**: stage(s) {', '.join(stages)}; layer(s) "
                         f"{', '.join(layers)}")
        lines += ["", "Worst parameters:", "", *worst_table(worst, MARKDOWN)]
    return lines + [""]
