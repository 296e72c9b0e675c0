"""Layout throughput's predicted step time: the layout model's, from the group's stated costs,
scaled through the baseline's measured step time."""

from __future__ import annotations

from harness.layout.step_model import StepCosts, StepModel
from harness.layout import LayerCosts
from harness.report.case_view import view
from harness.report.throughput import layout_groups

from .records import case

STEP = {"total_batch_size": 2 * 32 * 8}  # 8 microbatches of 2 x 32 tokens


def _group(costs_flag="1x8,L:4.5"):
    uniform = case("pipeline_layout", "gpt2", "pp2", flags=STEP)
    costed = case("pipeline_layout", "gpt2", "pp2-costs", chunks=[(0, 0, 6), (1, 6, 8)], tokens=1188.0,
                  flags={**STEP, "pipeline_layer_costs": costs_flag})
    partition = case("pipeline_layout", "gpt2", "pp2-3-5", chunks=[(0, 0, 3), (1, 3, 8)], tokens=900.0,
                     flags={**STEP, "pipeline_layer_partition": "3,5"})
    group, = layout_groups([view(r) for r in (uniform, costed, partition)])
    return group


def test_predictions_follow_the_stated_costs_and_the_baseline_is_its_measurement():
    group = _group()
    assert group.costs_source == "--pipeline_layer_costs of `pipeline_layout/gpt2/pp2-costs`"
    predicted = group.predicted_ms
    assert predicted["pipeline_layout/gpt2/pp2"] == 500.0  # the baseline's measured step_time_ms
    model = StepModel(StepCosts.from_layer_costs(LayerCosts((1.0,) * 8, 0.0, 4.5)), 2, 8)
    ratio = (model.evaluate((6, 2), (0, 1), "1F1B").step_time
             / model.evaluate((4, 4), (0, 1), "1F1B").step_time)
    assert abs(predicted["pipeline_layout/gpt2/pp2-costs"] - 500.0 * ratio) < 1e-9
    # The heavy head on the last stage: moving layers onto it is predicted slower, off it faster.
    assert predicted["pipeline_layout/gpt2/pp2-costs"] < 500.0 < predicted["pipeline_layout/gpt2/pp2-3-5"]


def test_without_stated_costs_every_layer_costs_the_same():
    uniform = case("pipeline_layout", "gpt2", "pp2", flags=STEP)
    other = case("pipeline_layout", "gpt2", "pp2-3-5", chunks=[(0, 0, 3), (1, 3, 8)], flags=STEP)
    group, = layout_groups([view(r) for r in (uniform, other)])
    assert group.costs_source == "equal layer costs"
    assert group.predicted_ms["pipeline_layout/gpt2/pp2-3-5"] > group.predicted_ms["pipeline_layout/gpt2/pp2"]


def test_report_table_shows_measured_and_predicted_step_time():
    from harness.report.markdown import throughput

    group = _group()
    text = "\n".join(throughput([group]))
    header = next(line for line in text.splitlines() if line.startswith("| case"))
    assert [c.strip() for c in header.strip("|").split("|")][-3:] == ["step ms", "predicted step ms", "status"]
    row = next(line for line in text.splitlines() if "pp2-3-5" in line)
    assert f"| {group.predicted_ms['pipeline_layout/gpt2/pp2-3-5']:.0f} " in row
    assert "from --pipeline_layer_costs of `pipeline_layout/gpt2/pp2-costs`" in text
