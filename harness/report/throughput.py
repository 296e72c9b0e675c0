"""Layout throughput: cases of one model and parallelism that differ only in their pipeline
layout, tokens/s side by side, relative to the uniform layout (the trainer's default), or to
the fastest when the group has no uniform case.

Beside each measured step time, the one the layout search's model predicts
(harness.layout.step_model: the schedule simulated over per-layer costs). The costs are those a
member of the group gave as --pipeline_layer_costs, else equal for every layer (no E / L): the
records hold no profile. The model's time is in cost units, so it is put in milliseconds through
the baseline: predicted = the baseline's measured step time x model(case) / model(baseline). The
baseline's own prediction is its measurement; the others show whether the model orders and
spaces the layouts as the measurements do."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness.layout import LayerCosts, LayoutError, PipelineLayout, parse_costs
from harness.layout.schedules import SCHEDULES_FOR_KIND, SIMULATED, chunk_order_kind
from harness.layout.step_model import StepCosts, StepModel
from harness.contracts.flags import role_of
from harness.results.values import number, section

from .case_view import LAYOUT_FLAGS, CaseView

# What is computed, besides the layout, read from the flag table's roles: mathematics and
# topology. Inputs, outputs (a run's own paths among them) and resume points do not count.
_COMPUTED_ROLES = ("mathematics", "topology")


@dataclass(frozen=True)
class LayoutGroup:
    title: str  # "gpt2, PP 2 / TP 1 / DP 1, float32"
    baseline: CaseView
    baseline_kind: str  # "uniform" | "fastest"
    members: list[CaseView]  # baseline first, then fastest first
    predicted_ms: dict[str, float]  # case name -> predicted step time (ms); absent: not modelled
    costs_source: str  # "--pipeline_layer_costs of `case`" | "equal layer costs"

    def ratio(self, case: CaseView) -> float:
        return case.tokens_per_s / self.baseline.tokens_per_s


def _key(v: CaseView) -> tuple:
    flags = {k: val for k, val in section(v.record, "flags").items()
             if role_of(k) in _COMPUTED_ROLES and k not in LAYOUT_FLAGS}
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
        predicted, source = predictions([baseline, *rest], baseline)
        result.append(LayoutGroup(title, baseline, kind, [baseline, *rest], predicted, source))
    return sorted(result, key=lambda g: g.title)


def predictions(members: list[CaseView], baseline: CaseView) -> tuple[dict[str, float], str]:
    """Predicted step time (ms) per case name, scaled through the baseline (module doc)."""
    measured = number(baseline.record.get("step_time_ms"))
    base_layout = _layout(baseline)
    if not measured or base_layout is None:
        return {}, "not modelled: the baseline has no step time or layout"
    costs, source = LayerCosts((1.0,) * base_layout.num_layers), "equal layer costs"
    for m in members:
        spec = section(m.record, "flags").get("pipeline_layer_costs")
        if spec:
            try:
                costs, source = parse_costs(spec, base_layout.num_layers), f"--pipeline_layer_costs of `{m.name}`"
                break
            except LayoutError:
                continue
    step_costs = StepCosts.from_layer_costs(costs)
    modelled = {m.name: _model_time(m, step_costs) for m in members}
    base = modelled[baseline.name]
    if not base:
        return {}, "not modelled: the baseline's schedule is not simulated"
    return {name: measured * t / base for name, t in modelled.items() if t}, source


def _layout(case: CaseView) -> PipelineLayout | None:
    try:
        return PipelineLayout.from_dict(section(case.record, "layout"))
    except LayoutError:
        return None


def _model_time(case: CaseView, costs: StepCosts) -> float | None:
    layout = _layout(case)
    flags = section(case.record, "flags")
    try:
        per_microbatch = int(flags["batch_size"]) * int(flags["sequence_length"]) * case.dp
        # Without --total_batch_size the trainer runs one microbatch a step.
        microbatches = int(flags.get("total_batch_size") or per_microbatch) // per_microbatch
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if layout is None or layout.num_layers != costs.num_layers or microbatches < 1:
        return None
    stages = tuple(s for s, _, _ in layout.chunks)
    fitting = SCHEDULES_FOR_KIND[chunk_order_kind(stages, layout.pp)]
    name = next((n for n in fitting if n.lower() == case.schedule.lower()), fitting[0])
    model = StepModel(costs, layout.pp, microbatches)
    if name not in SIMULATED or model.runs(name, len(stages)):
        return None
    return model.evaluate([b - a for _, a, b in layout.chunks], stages, name).step_time
