import json

import pytest
from hypothesis import given, settings

from harness.layout import LayoutError, PipelineLayout

from .strategies import layouts


def test_uniform_gives_remainder_to_earliest_chunks_round_robin():
    layout = PipelineLayout.uniform(10, 2, vpp=2)
    assert layout.chunks == ((0, 0, 3), (1, 3, 6), (0, 6, 8), (1, 8, 10))
    assert layout.layer_ranges(0) == [(0, 3), (6, 8)]
    assert layout.layer_ranges(1) == [(3, 6), (8, 10)]
    assert layout.stage_layer_counts() == (5, 5)
    assert (layout.num_layers, layout.pp, layout.vpp) == (10, 2, 2)


def test_uniform_with_more_chunks_than_layers_leaves_late_chunks_empty():
    layout = PipelineLayout.uniform(3, 2, vpp=2)
    assert [b - a for _, a, b in layout.chunks] == [1, 1, 1, 0]
    assert layout.owns_lm_head(1)


def test_partition_places_one_chunk_per_stage():
    layout = PipelineLayout.from_partition(24, "4,8,6,6")
    assert layout.chunks == ((0, 0, 4), (1, 4, 12), (2, 12, 18), (3, 18, 24))
    assert layout.vpp == 1
    assert PipelineLayout.from_partition(24, [4, 8, 6, 6], pp=4) == layout
    assert PipelineLayout.from_partition(24, " 4, 8 ,6,6 ") == layout


def test_chunk_layout_in_v_order():
    layout = PipelineLayout.from_chunk_layout(12, 2, "0:3,1:3,1:3,0:3")
    assert layout.vpp == 2
    assert layout.layer_ranges(0) == [(0, 3), (9, 12)]
    assert layout.layer_ranges(1) == [(3, 6), (6, 9)]
    assert layout.owns_embedding(0) and layout.owns_lm_head(0) and layout.owns_final_norm(0)
    assert not layout.owns_embedding(1) and not layout.owns_lm_head(1)
    assert not layout.is_round_robin()
    assert layout.stage_for_layer(7) == 1 and layout.stage_for_layer(11) == 0


def test_chunk_layout_allows_empty_chunks():
    layout = PipelineLayout.from_chunk_layout(4, 2, "0:2,1:0,0:0,1:2")
    assert layout.layer_ranges(1) == [(2, 2), (2, 4)]


def test_megatron_example_from_the_spec():
    layout = PipelineLayout.from_megatron(12, 2, "Et*3||t*3|t*6NL")
    assert layout.vpp == 2
    assert layout.layer_ranges(0) == [(0, 3), (3, 6)]
    assert layout.layer_ranges(1) == [(3, 3), (6, 12)]
    assert layout.to_megatron() == "Et*3||t*3|t*6NL"


def test_describe_lists_every_stage_with_markers():
    text = str(PipelineLayout.from_partition(8, "5,3"))
    assert text == ("pipeline layout: 8 layers, pp=2, vpp=1 (megatron: Et*5|t*3NL)\n"
                    "  stage 0: chunk 0 [E, layers 0-4 (5)]\n"
                    "  stage 1: chunk 1 [layers 5-7 (3), N, L]")
    v_text = PipelineLayout.from_chunk_layout(4, 2, "0:1,1:0,1:2,0:1").describe()
    assert "(chunks: 0:1,1:0,1:2,0:1)" in v_text
    assert "  stage 1: chunk 1 [no layers] chunk 2 [layers 1-2 (2)]" in v_text
    assert "  stage 0: chunk 0 [E, layer 0 (1)] chunk 3 [layer 3 (1), N, L]" in v_text


def test_layouts_are_hashable_values():
    a = PipelineLayout.from_partition(8, "6,2")
    b = PipelineLayout.from_costs(8, 2, "1x8,L:4.5")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.pp = 3


def test_json_form_is_documented_and_validated():
    layout = PipelineLayout.from_partition(8, "6,2")
    data = json.loads(layout.to_json())
    assert data == {"format": "harness.pipeline_layout/1", "num_layers": 8, "pp": 2, "vpp": 1,
                    "chunks": [[0, 0, 6], [1, 6, 8]]}
    data["chunks"][1] = [1, 5, 8]
    with pytest.raises(LayoutError, match="contiguous"):
        PipelineLayout.from_dict(data)
    with pytest.raises(LayoutError, match="malformed"):
        PipelineLayout.from_json("{")
    with pytest.raises(LayoutError, match="format"):
        PipelineLayout.from_json('{"pp": 2}')


def test_queries_reject_out_of_range_arguments():
    layout = PipelineLayout.uniform(4, 2)
    with pytest.raises(LayoutError, match="stage 2 is out of range; --pipeline_parallel is 2"):
        layout.layer_ranges(2)
    with pytest.raises(LayoutError, match="layer 4 is out of range"):
        layout.stage_for_layer(4)


def test_non_round_robin_layout_has_no_megatron_form():
    with pytest.raises(LayoutError, match="--pipeline_chunk_layout"):
        PipelineLayout.from_chunk_layout(4, 2, "0:1,1:1,1:1,0:1").to_megatron()


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_invariants(layout):
    owners = [layout.stage_for_layer(i) for i in range(layout.num_layers)]
    seen = [i for stage, start, end in layout.chunks for i in range(start, end)]
    assert seen == list(range(layout.num_layers))  # every layer once, contiguous, in order
    assert owners == [s for s, a, b in layout.chunks for _ in range(a, b)]
    assert sum(layout.stage_layer_counts()) == layout.num_layers
    assert [len(layout.layer_ranges(s)) for s in range(layout.pp)] == [layout.vpp] * layout.pp
    assert [s for s in range(layout.pp) if layout.owns_embedding(s)] == [layout.chunks[0][0]]
    assert [s for s in range(layout.pp) if layout.owns_lm_head(s)] == [layout.chunks[-1][0]]
    assert layout.describe().count("\n  stage ") == layout.pp


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_json_and_chunk_layout_round_trip(layout):
    assert PipelineLayout.from_json(layout.to_json()) == layout
    assert PipelineLayout.from_chunk_layout(layout.num_layers, layout.pp, layout.to_chunk_layout()) == layout


@settings(max_examples=150, deadline=None)
@given(layouts(round_robin=True))
def test_megatron_round_trip(layout):
    text = layout.to_megatron()
    assert PipelineLayout.from_megatron(layout.num_layers, layout.pp, text) == layout
    assert text.startswith("E") and text.endswith("NL")


def test_a_layout_is_built_from_flags_by_name_in_one_function():
    from harness.layout import layout_from_flags, resolve_layout

    assert layout_from_flags(8, {}) == resolve_layout(8, 1)
    assert layout_from_flags(8, {"pipeline_parallel": 2, "pipeline_layer_partition": "5,3"}) == \
        resolve_layout(8, 2, partition="5,3")
    assert layout_from_flags(8, {"pipeline_parallel": 2, "virtual_pipeline_parallel": 2,
                                 "pipeline_chunk_layout": "0:2,1:2,1:2,0:2"}) == \
        resolve_layout(8, 2, 2, chunk_layout="0:2,1:2,1:2,0:2")
