"""The markdown of a comparison: the trend of this session against an earlier one."""

from __future__ import annotations

from harness.results.values import md_escape, percent, whole

from .markdown import STATUS_MARK, table
from .session_diff import SPEED_THRESHOLD, Comparison


def comparison(result: Comparison) -> list[str]:
    lines = [f"## Against session {result.old_label}", ""]
    if result.settings:
        lines += ["**The two sessions ran with different settings**: "
                  + "; ".join(f"{what} {old} → {new}" for what, old, new in result.settings)
                  + ". Differences below may come from these.", ""]
    lines += [f"- newly failing: **{len(result.newly_failing)}**; newly passing: "
              f"**{len(result.newly_passing)}**; still failing: {len(result.still_failing)}",
              f"- faster: **{len(result.faster)}**; slower: **{len(result.slower)}**; changes "
              f"of {SPEED_THRESHOLD:.0%} or more within noise or not judged: "
              f"{len(result.unjudged)} (of {len(result.speed)} cases timed in both)",
              f"- new cases: {len(result.added)}; cases gone: {len(result.removed)}", ""]
    for title, pairs in (("Newly failing", result.newly_failing),
                         ("Newly passing", result.newly_passing),
                         ("Other status changes", result.other_changes)):
        if pairs:
            rows = [[f"`{new.name}`", STATUS_MARK.get(old.status, old.status),
                     STATUS_MARK.get(new.status, new.status), new.record.get("reason") or ""]
                    for old, new in pairs]
            lines += [f"### {title}", "", *table(rows, ["case", "before", "now", "reason"]), ""]
    # regressions first, then gains, then what moved but cannot be told from noise
    changed = result.slower + result.faster[::-1] + result.unjudged
    if changed:
        rows = []
        for old, new, ratio in changed:
            j = result.judgement(old, new, ratio)
            rows.append([f"`{new.name}`", whole(old.tokens_per_s), whole(new.tokens_per_s),
                         f"{ratio:.3f}", percent(ratio), j.band_text, j.verdict])
        lines += ["### Throughput changes", "",
                  f"tokens/s now over before. A change is called faster or slower only when it "
                  f"is outside the noise band (two standard errors of both cases' mean step "
                  f"times) and at least {SPEED_THRESHOLD:.0%}; smaller changes are left out.",
                  "", *table(rows, ["case", "tokens/s before", "tokens/s now", "ratio",
                                    "change", "noise band", "verdict"]), ""]
    for title, cases in (("New cases", result.added), ("Cases gone", result.removed)):
        if cases:
            lines += [f"### {title}", "", *(f"- `{md_escape(c.name)}` ({c.status})"
                                           for c in cases), ""]
    return lines
