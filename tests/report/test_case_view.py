"""Normalizing a record into a table row, counting statuses, and grouping layouts."""

from __future__ import annotations

import pytest

from harness.report.case_view import is_uniform, short_layout, status_counts, view
from harness.report.throughput import layout_groups

from .records import case, failing_session, passing_session


@pytest.mark.parametrize("chunks, pp, vpp, short, uniform", [
    ([[0, 0, 4], [1, 4, 8]], 2, 1, "4,4", True),
    ([[0, 0, 6], [1, 6, 8]], 2, 1, "6,2", False),
    ([[0, 0, 2], [1, 2, 5], [0, 5, 7], [1, 7, 8]], 2, 2, "0:2,1:3,0:2,1:1", False),
    ([[0, 0, 2], [1, 2, 4], [0, 4, 6], [1, 6, 8]], 2, 2, "0:2,1:2,0:2,1:2", True),
])
def test_layout_short_form_and_uniformity(chunks, pp, vpp, short, uniform):
    layout = {"num_layers": 8, "pp": pp, "vpp": vpp, "chunks": chunks}
    assert short_layout(layout, pp) == short
    assert is_uniform(layout) is uniform


def test_a_layout_not_recorded():
    assert short_layout({}, 1) == "–" and short_layout({"chunks": "x"}, 2) == "?"
    assert is_uniform({}) is None


def test_vpp_comes_from_the_layout_when_a_megatron_string_set_it():
    record = case("pipeline_layout", "gpt2", "megatron",
                  chunks=[(0, 0, 3), (1, 3, 5), (0, 5, 5), (1, 5, 8)], vpp=1)
    record["layout"]["vpp"] = 2
    v = view(record)
    assert (v.vpp, v.layout, v.schedule, v.wall_s) == (2, "0:3,1:2,0:0,1:3", "auto", 30.5)


def test_status_counts_per_tag_and_model_with_unrecorded_cases():
    views = [view(r) for r in failing_session()]
    rows = {(r["tag"], r["model"]): r for r in status_counts(views, ["basic/gpt2/tp2"])}
    assert rows[("basic", "gpt2")] == {"tag": "basic", "model": "gpt2", "passed": 2,
                                          "failed": 0, "skipped": 1, "error": 0,
                                          "unrecorded": 1, "total": 4}
    assert rows[("pipeline_layout", "gpt2")]["failed"] == 1
    assert rows[("basic", "llama3")]["error"] == 1


def test_layout_groups_relative_to_uniform_or_else_the_fastest():
    groups = {g.title: g for g in layout_groups([view(r) for r in passing_session()])}
    gpt2 = groups["gpt2, PP 2 / TP 1 / DP 1, float32"]
    assert gpt2.baseline_kind == "uniform" and gpt2.baseline.case_id == "pp2"
    ratios = {m.case_id: round(gpt2.ratio(m), 4) for m in gpt2.members}
    assert ratios == {"pp2": 1.0, "pp2-costs-L4.5": 1.188, "pp2-partition-3-5": 1.1}
    llama = groups["llama3, PP 2 / TP 1 / DP 1, float32"]
    assert llama.baseline_kind == "fastest" and llama.baseline.case_id == "pp2-costs-L4.5"
    assert round(llama.ratio(llama.members[1]), 4) == 0.8889


def test_cases_differing_in_more_than_layout_are_not_compared():
    a = case("t", "gpt2", "a", chunks=[(0, 0, 4), (1, 4, 8)])
    b = case("t", "gpt2", "b", chunks=[(0, 0, 3), (1, 3, 8)], flags={"batch_size": 4})
    c = case("t", "gpt2", "c", chunks=[(0, 0, 3), (1, 3, 8)], dp=2)
    assert layout_groups([view(r) for r in (a, b, c)]) == []
