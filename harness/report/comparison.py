"""Two sessions side by side, matched by case name (tag/model/id): what newly fails, what newly
passes, what appeared or went away, and what got faster or slower (new tokens/s over old)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .summary import CaseView

BAD = ("failed", "error")
SPEED_THRESHOLD = 0.05  # a change under 5% is noise on a shared GPU box


@dataclass
class Comparison:
    old_label: str
    new_label: str
    newly_failing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    newly_passing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    still_failing: list[tuple[CaseView, CaseView]] = field(default_factory=list)
    other_changes: list[tuple[CaseView, CaseView]] = field(default_factory=list)  # e.g. -> skipped
    added: list[CaseView] = field(default_factory=list)
    removed: list[CaseView] = field(default_factory=list)
    speed: list[tuple[CaseView, CaseView, float]] = field(default_factory=list)  # new/old

    @property
    def faster(self) -> list[tuple[CaseView, CaseView, float]]:
        return [s for s in self.speed if s[2] >= 1 + SPEED_THRESHOLD]

    @property
    def slower(self) -> list[tuple[CaseView, CaseView, float]]:
        return [s for s in self.speed if s[2] <= 1 - SPEED_THRESHOLD]


def compare(old: list[CaseView], new: list[CaseView], old_label: str, new_label: str) -> Comparison:
    result = Comparison(old_label, new_label)
    old_by_name = {v.name: v for v in old}
    new_names = {v.name for v in new}
    for case in new:
        before = old_by_name.get(case.name)
        if before is None:
            result.added.append(case)
            continue
        pair = (before, case)
        if case.status in BAD and before.status not in BAD:
            result.newly_failing.append(pair)
        elif case.status == "passed" and before.status in BAD:
            result.newly_passing.append(pair)
        elif case.status in BAD:
            result.still_failing.append(pair)
        elif case.status != before.status:
            result.other_changes.append(pair)
        if case.tokens_per_s and before.tokens_per_s:
            result.speed.append((before, case, case.tokens_per_s / before.tokens_per_s))
    result.removed = [v for v in old if v.name not in new_names]
    result.speed.sort(key=lambda s: s[2])  # slowest-relative first: regressions lead
    return result
