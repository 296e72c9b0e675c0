"""The markdown of a comparison: the trend of this session against an earlier one."""

from __future__ import annotations

from .comparison import SPEED_THRESHOLD, Comparison
from .sections import STATUS_MARK, table
from .values import md_escape, percent, whole


def comparison(result: Comparison) -> list[str]:
    lines = [f"## Against session {result.old_label}", "",
             f"- newly failing: **{len(result.newly_failing)}**; newly passing: "
             f"**{len(result.newly_passing)}**; still failing: {len(result.still_failing)}",
             f"- faster by {SPEED_THRESHOLD:.0%} or more: **{len(result.faster)}**; slower: "
             f"**{len(result.slower)}** (of {len(result.speed)} cases timed in both)",
             f"- new cases: {len(result.added)}; cases gone: {len(result.removed)}", ""]
    for title, pairs in (("Newly failing", result.newly_failing),
                         ("Newly passing", result.newly_passing),
                         ("Other status changes", result.other_changes)):
        if pairs:
            rows = [[f"`{new.name}`", STATUS_MARK.get(old.status, old.status),
                     STATUS_MARK.get(new.status, new.status), new.record.get("reason") or ""]
                    for old, new in pairs]
            lines += [f"### {title}", "", *table(rows, ["case", "before", "now", "reason"]), ""]
    changed = result.slower + result.faster[::-1]  # regressions first, biggest gains last-first
    if changed:
        rows = [[f"`{new.name}`", whole(old.tokens_per_s), whole(new.tokens_per_s),
                 f"{ratio:.3f}", percent(ratio), "slower" if ratio < 1 else "faster"]
                for old, new, ratio in changed]
        lines += ["### Throughput changes", "",
                  f"tokens/s now over before; changes under {SPEED_THRESHOLD:.0%} are left out.",
                  "", *table(rows, ["case", "tokens/s before", "tokens/s now", "ratio",
                                    "change", ""]), ""]
    for title, cases in (("New cases", result.added), ("Cases gone", result.removed)):
        if cases:
            lines += [f"### {title}", "", *(f"- `{md_escape(c.name)}` ({c.status})"
                                           for c in cases), ""]
    return lines
