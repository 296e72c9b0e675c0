"""The report's baseline section: each case's baseline check beside its self-check, and the
divergence from the baseline step by step (harness.baseline; the record's `baseline` field)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.compare.baseline import BASELINE_THRESHOLDS, step_limit
from harness.results.baseline_summary import baseline_summary
from harness.results.values import md_escape


@dataclass(frozen=True)
class Divergence:
    """One case's loss against its baseline, step by step, as a share of what the verdict
    allows at each step (harness.compare.baseline.step_limit): over 1 is a diverging step."""

    name: str
    model: str
    steps: tuple[int, ...]
    ratios: tuple[float, ...]  # |run - baseline| / the step's limit; NaN where not recorded
    first_diverging_step: int | None
    status: str


def divergence(record: dict) -> Divergence | None:
    """None for a record without a judged baseline loss (no check, a bad pairing, or a record
    written before the verdict kept its baseline losses and resolution)."""
    baseline = record.get("baseline")
    loss = (baseline.get("loss") if isinstance(baseline, dict) else None) or {}
    steps, diffs, bases = loss.get("steps"), loss.get("diffs"), loss.get("base_losses")
    dtype, resolution = loss.get("dtype"), loss.get("resolution")
    if (not steps or dtype not in BASELINE_THRESHOLDS or resolution is None
            or not isinstance(diffs, list) or not isinstance(bases, list)
            or not len(steps) == len(diffs) == len(bases)):
        return None
    ratios = tuple(math.nan if d is None or b is None else d / step_limit(dtype, b, resolution)
                   for d, b in zip(diffs, bases))
    return Divergence(str(record.get("name")), str(record.get("model")), tuple(steps), ratios,
                      baseline.get("first_diverging_step"), str(baseline.get("status")))


def _g(value) -> str:
    return "n/a" if value is None else f"{float(value):.2g}"


def _gradients(baseline: dict) -> str:
    """The gradients' cell: how many parameters agreed, the worst, or why none were compared."""
    grads = baseline.get("gradients")
    if not isinstance(grads, dict):
        reason = baseline.get("gradients_reason")
        return f"not compared: {reason}" if reason else "-"
    count = grads.get("parameters")
    if grads.get("ok"):
        return f"passed ({count} parameters)"
    relative = grads.get("relative") or {}
    failed = len(relative.get("failed") or []) or grads.get("mismatched")
    worst = (f", worst `{relative['worst_parameter']}` {_g(relative.get('worst'))}"
             if relative.get("worst_parameter") else "")
    broken = len(grads.get("missing") or []) + len(grads.get("extra") or []) + \
        len(grads.get("shape_errors") or [])
    return (f"failed: {failed} of {count} differ{worst}"
            + (f"; {broken} missing, extra or of another shape" if broken else ""))


def section(records: list[dict], figures: dict[str, str] | None = None) -> list[str]:
    """The lines of "## Baseline check", or the one line saying none was checked; nothing for
    a bundled-trainer session that asked for no baseline. `figures`: model -> the divergence
    plot's file name (harness.report.plots.divergence_figure), linked below the table."""
    line = baseline_summary(records)
    if line is None:
        return []
    lines = ["## Baseline check (an independent implementation)", "", line, ""]
    checked = [r for r in records if isinstance(r.get("baseline"), dict)]
    if not checked:
        return lines
    lines += ["| case | self-check | baseline | source | first diverging step | worst \\|Δ\\| "
              "(step) | threshold | gradients | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(checked, key=lambda r: str(r.get("name"))):
        b = r["baseline"]
        loss = b.get("loss") or {}
        worst = (f"{_g(loss.get('max_abs_diff'))} ({loss.get('worst_step')})"
                 if loss.get("worst_step") is not None else "n/a")
        lines.append(
            f"| `{r.get('name')}` | {r.get('self_check') or 'n/a'} | {b.get('status')} | "
            f"{md_escape(str(b.get('source')))} | {b.get('first_diverging_step') or '-'} | "
            f"{worst} | {loss.get('threshold') or 'n/a'} | {md_escape(_gradients(b))} | "
            f"{md_escape(b.get('reason') or b.get('note') or '')} |")
    diverged = [r for r in checked if (r["baseline"].get("loss") or {}).get("diffs")]
    if diverged:
        lines += ["", "|Δ| against the baseline, step by step:", ""]
        for r in sorted(diverged, key=lambda r: str(r.get("name"))):
            loss = r["baseline"]["loss"]
            steps = ", ".join(f"{s}: {_g(d)}" for s, d in zip(loss["steps"], loss["diffs"]))
            lines.append(f"- `{r.get('name')}`: {steps}")
    for model, link in sorted((figures or {}).items()):
        lines += ["", f"![{model}: loss against the baseline, as a share of the threshold, "
                      f"per step]({link})"]
    return lines + [""]
