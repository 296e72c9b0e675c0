import pytest

from harness.layout import LayerCosts, LayoutError, PipelineLayout, parse_costs
from harness.layout.megatron import parse_megatron


@pytest.mark.parametrize("text, pp, n, counts", [
    ("Et*3||t*3|t*6NL", 2, 12, [3, 0, 3, 6]),
    ("Ettt|tttL", 2, 6, [3, 3]),                      # N is optional
    ("E, t t t | t t t N L", 2, 6, [3, 3]),           # commas and whitespace are ignored
    ("Et|*3tL", 2, 2, [1, 0, 0, 1]),                  # |*n repeats the separator
    ("E(t*2|)*3t*2NL", 2, 8, [2, 2, 2, 2]),           # a group holding |
    ("E((t|)*2)*2tNL", 5, 5, [1, 1, 1, 1, 1]),        # nested groups
    ("Et * 2 | t * 2 NL", 2, 4, [2, 2]),              # spaces around * and the count
    ("EtNL", 1, 1, [1]),
    ("ENL", 1, 1, None),                              # t count checked below
])
def test_grammar_features(text, pp, n, counts):
    if counts is None:
        with pytest.raises(LayoutError, match="has 0 t"):
            parse_megatron(n, pp, text)
    else:
        assert parse_megatron(n, pp, text) == counts


def test_megatron_segments_go_round_robin():
    layout = PipelineLayout.from_megatron(6, 3, "Et|t|t|t|t|tNL")
    assert layout.vpp == 2
    assert layout.layer_ranges(2) == [(2, 3), (5, 6)]
    assert layout.owns_lm_head(2) and layout.owns_embedding(0)


def test_megatron_with_and_without_n_are_the_same_layout():
    assert PipelineLayout.from_megatron(4, 2, "Ett|ttL") == PipelineLayout.from_megatron(4, 2, "Ett|ttNL")


def test_cost_spec_forms():
    costs = parse_costs(" 2x2, 1 ,E:0.5, 3x1,L:4.5")
    assert costs == LayerCosts((2.0, 2.0, 1.0, 3.0), 0.5, 4.5)
    assert parse_costs("1e-3x2").layers == (0.001, 0.001)
    assert parse_costs("-0,0").layers == (0.0, 0.0)


@pytest.mark.parametrize("spec", ["1x8,L:4.5", "1,2,3,E:0.1", "0.1x3,10.9x2,E:2,L:3", "7"])
def test_cost_spec_round_trips(spec):
    costs = parse_costs(spec)
    assert parse_costs(costs.to_spec()) == costs


def test_cost_spec_checks_count_only_when_asked():
    assert len(parse_costs("1x3").layers) == 3
    with pytest.raises(LayoutError, match="gives 3 layer costs, but the model has 4"):
        parse_costs("1x3", num_layers=4)


def test_layer_costs_built_directly_are_checked():
    with pytest.raises(LayoutError, match="layer cost -1.0 is invalid"):
        LayerCosts((1.0, -1.0))
    with pytest.raises(LayoutError, match="lm_head cost inf is invalid"):
        LayerCosts((1.0,), lm_head=float("inf"))


def test_from_costs_accepts_layer_costs():
    costs = LayerCosts((1.0,) * 8, lm_head=4.5)
    assert PipelineLayout.from_costs(8, 2, costs) == PipelineLayout.from_partition(8, "6,2")
