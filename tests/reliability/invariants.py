"""What every accepted layout must satisfy, checked through the public queries."""

from __future__ import annotations

from harness.layout import PipelineLayout


def check_layout(layout: PipelineLayout, num_layers: int, pp: int) -> None:
    """Every layer exactly once, contiguous and in order; every stage has vpp chunks; the
    embedding on the first chunk's stage, the final norm and head on the last chunk's."""
    assert layout.num_layers == num_layers and layout.pp == pp and layout.vpp >= 1
    chunks = layout.chunks
    assert len(chunks) == pp * layout.vpp
    position = 0
    for stage, start, end in chunks:  # global order: contiguous, in order, possibly empty
        assert 0 <= stage < pp
        assert start == position and end >= start
        position = end
    assert position == num_layers
    covered = [layer for _, start, end in chunks for layer in range(start, end)]
    assert covered == list(range(num_layers))  # every layer exactly once
    for stage in range(pp):
        assert len(layout.layer_ranges(stage)) == layout.vpp
        assert layout.owns_embedding(stage) == (stage == chunks[0][0])
        assert layout.owns_lm_head(stage) == (stage == chunks[-1][0])
        assert layout.owns_final_norm(stage) == layout.owns_lm_head(stage)
    for layer in range(num_layers):
        stage = layout.stage_for_layer(layer)
        assert any(a <= layer < b for a, b in layout.layer_ranges(stage))
    assert sum(layout.stage_layer_counts()) == num_layers
    assert PipelineLayout.from_chunk_layout(num_layers, pp, layout.to_chunk_layout()) == layout
    if layout.is_round_robin():
        assert PipelineLayout.from_megatron(num_layers, pp, layout.to_megatron()) == layout
    assert PipelineLayout.from_json(layout.to_json()) == layout
