"""The report's baseline section: each case's baseline check beside its self-check, and the
divergence from the baseline step by step (harness.baseline; the record's `baseline` field)."""

from __future__ import annotations

from harness.baseline.summary import baseline_summary

from .values import md_escape


def _g(value) -> str:
    return "n/a" if value is None else f"{float(value):.2g}"


def section(records: list[dict]) -> list[str]:
    """The lines of "## Baseline check", or the one line saying none was checked; nothing for
    a bundled-trainer session that asked for no baseline."""
    line = baseline_summary(records)
    if line is None:
        return []
    lines = ["## Baseline check (an independent implementation)", "", line, ""]
    checked = [r for r in records if isinstance(r.get("baseline"), dict)]
    if not checked:
        return lines
    lines += ["| case | self-check | baseline | source | first diverging step | worst \\|Δ\\| "
              "(step) | threshold | reason |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(checked, key=lambda r: str(r.get("name"))):
        b = r["baseline"]
        loss = b.get("loss") or {}
        worst = (f"{_g(loss.get('max_abs_diff'))} ({loss.get('worst_step')})"
                 if loss.get("worst_step") is not None else "n/a")
        lines.append(
            f"| `{r.get('name')}` | {r.get('self_check') or 'n/a'} | {b.get('status')} | "
            f"{md_escape(str(b.get('source')))} | {b.get('first_diverging_step') or '-'} | "
            f"{worst} | {loss.get('threshold') or 'n/a'} | "
            f"{md_escape(b.get('reason') or b.get('note') or '')} |")
    diverged = [r for r in checked if (r["baseline"].get("loss") or {}).get("diffs")]
    if diverged:
        lines += ["", "|Δ| against the baseline, step by step:", ""]
        for r in sorted(diverged, key=lambda r: str(r.get("name"))):
            loss = r["baseline"]["loss"]
            steps = ", ".join(f"{s}: {_g(d)}" for s, d in zip(loss["steps"], loss["diffs"]))
            lines.append(f"- `{r.get('name')}`: {steps}")
    return lines + [""]
