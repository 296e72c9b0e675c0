"""Hypothesis strategies shared by the layout tests."""

from hypothesis import strategies as st

from harness.layout import PipelineLayout

# Non-dyadic values (0.1, 10.9) are there on purpose: they are where float rounding would bite.
COST_VALUES = st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 4.5, 7.0, 10.9, 1e-3, 123.25])


@st.composite
def layouts(draw, round_robin: bool | None = None) -> PipelineLayout:
    pp = draw(st.integers(1, 4))
    vpp = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(0, 4), min_size=pp * vpp, max_size=pp * vpp))
    if sum(sizes) == 0:
        sizes[0] = 1
    stages = [g % pp for g in range(pp * vpp)]
    if round_robin is False or (round_robin is None and draw(st.booleans())):
        stages = draw(st.permutations(stages))
    return PipelineLayout.from_chunk_sizes(sum(sizes), pp, list(zip(stages, sizes)))


@st.composite
def cost_problems(draw, max_layers: int = 8, max_stages: int = 4):
    """(layer costs, pp, embedding cost, lm head cost) with pp <= number of layers."""
    costs = draw(st.lists(COST_VALUES, min_size=1, max_size=max_layers))
    pp = draw(st.integers(1, min(max_stages, len(costs))))
    return costs, pp, draw(COST_VALUES), draw(COST_VALUES)
