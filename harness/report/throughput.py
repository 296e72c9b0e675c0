"""Layout throughput: cases of one model and parallelism that differ only in their pipeline
layout, tokens/s side by side, relative to the uniform layout (the trainer's default), or to
the fastest when the group has no uniform case."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .case_view import LAYOUT_FLAGS, CaseView
from .values import section

# Flags that name files or switch on recording: they do not change what is computed.
_NOT_PARALLELISM = set(LAYOUT_FLAGS) | {"output_dir", "dump_gradients", "profile_layers",
                                       "device"}


@dataclass(frozen=True)
class LayoutGroup:
    title: str  # "gpt2, PP 2 / TP 1 / DP 1, float32"
    baseline: CaseView
    baseline_kind: str  # "uniform" | "fastest"
    members: list[CaseView]  # baseline first, then fastest first

    def ratio(self, case: CaseView) -> float:
        return case.tokens_per_s / self.baseline.tokens_per_s


def _key(v: CaseView) -> tuple:
    flags = {k: val for k, val in section(v.record, "flags").items() if k not in _NOT_PARALLELISM}
    return (v.model, v.pp, v.tp, v.dp, v.sequence_parallel, v.dtype, v.schedule,
            json.dumps(flags, sort_keys=True, default=str))


def layout_groups(views: list[CaseView]) -> list[LayoutGroup]:
    groups: dict[tuple, list[CaseView]] = {}
    for v in views:
        if v.pp > 1 and v.tokens_per_s and v.tokens_per_s > 0 and v.layout not in ("?", "–"):
            groups.setdefault(_key(v), []).append(v)
    result = []
    for key, members in groups.items():
        if len({m.layout for m in members}) < 2:
            continue  # nothing to compare: one layout only
        uniform = sorted((m for m in members if m.uniform), key=lambda m: (m.vpp, m.name))
        fastest = max(members, key=lambda m: m.tokens_per_s)
        baseline, kind = (uniform[0], "uniform") if uniform else (fastest, "fastest")
        rest = sorted((m for m in members if m is not baseline), key=lambda m: -m.tokens_per_s)
        model, pp, tp, dp, sp, dtype, schedule, _ = key
        title = (f"{model}, PP {pp} / TP {tp}{' +SP' if sp else ''} / DP {dp}, {dtype}"
                 + (f", schedule {schedule}" if schedule != "auto" else ""))
        result.append(LayoutGroup(title, baseline, kind, [baseline, *rest]))
    return sorted(result, key=lambda g: g.title)
