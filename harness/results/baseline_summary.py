"""The session summary's baseline line, from the result records alone: what the baseline check
decided, or, for a foreign trainer's session that asked for none, that none was checked (the
self-check alone passes a bug every configuration shares)."""

from __future__ import annotations

from collections import Counter

NONE_CHECKED = ("baseline: none checked: every case was compared with the same trainer on one "
                "device only, which a bug every configuration shares passes (add "
                "--harness-baseline pytorch, or a folder of recorded logs)")


def baseline_summary(records: list[dict]) -> str | None:
    """One line for pytest's summary and the report, or None for a session of the bundled
    trainer alone that asked for no baseline."""
    checked = [r for r in records if isinstance(r.get("baseline"), dict)]
    if not checked:
        foreign = any(r.get("trainer") not in (None, "harness") for r in records)
        return NONE_CHECKED if foreign else None
    counts = Counter(r["baseline"].get("status") for r in checked)
    sources = sorted({str(r["baseline"].get("source")) for r in checked})
    text = ", ".join(f"{counts[s]} {s}" for s in ("passed", "failed", "skipped", "error")
                     if counts[s])
    diverging = [f"{r.get('name')} at step {r['baseline']['first_diverging_step']}"
                 for r in checked if r["baseline"].get("first_diverging_step") is not None]
    line = f"baseline ({', '.join(sources)}): {text}"
    if diverging:
        shown = "; ".join(diverging[:5]) + (f"; {len(diverging) - 5} more" if len(diverging) > 5
                                           else "")
        line += f"; first diverging: {shown}"
    return line
