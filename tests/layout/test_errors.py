"""Every error case of the SPEC: the message names the flag, the value, and what was expected."""

import pytest

from harness.layout import LayoutError, PipelineLayout, resolve_layout

PART, COSTS = "--pipeline_layer_partition", "--pipeline_layer_costs"
CHUNKS, MEG = "--pipeline_chunk_layout", "--pipeline_model_parallel_layout"
PP, VPP = "--pipeline_parallel", "--virtual_pipeline_parallel"


def partition(value, n=24, pp=4, vpp=1):
    return lambda: resolve_layout(n, pp, vpp, partition=value)


def costs(value, n=8, pp=2, vpp=1):
    return lambda: resolve_layout(n, pp, vpp, costs=value)


def chunks(value, n=12, pp=2, vpp=1):
    return lambda: resolve_layout(n, pp, vpp, chunk_layout=value)


def megatron(value, n=4, pp=2, vpp=1):
    return lambda: resolve_layout(n, pp, vpp, megatron_layout=value)


CASES = {
    # --pipeline_layer_partition
    "partition wrong entry count": (partition("8,8,8"), [PART, "'8,8,8'", "has 3 entries, but --pipeline_parallel is 4"]),
    "partition wrong sum": (partition("4,4,4,4"), [PART, "'4,4,4,4'", "sums to 16 layers, but the model has 24"]),
    "partition zero entry": (partition("4,0,10,10"), [PART, "'4,0,10,10'", "'0' is not positive", "one positive"]),
    "partition negative entry": (partition("4,-1,11,10"), [PART, "'-1' is not positive"]),
    "partition empty entry": (partition("4,,10,10"), [PART, "'4,,10,10'", "empty entry at position 2", "one positive"]),
    "partition empty": (lambda: PipelineLayout.from_partition(24, " "), [PART, "is empty", "one positive"]),
    "partition non-integer": (partition("4,8.5,6,5.5"), [PART, "'4,8.5,6,5.5'", "'8.5' is not an integer"]),
    "partition with vpp": (partition("6,6,6,6", vpp=2), [PART, "'6,6,6,6'", f"{VPP} is 2", f"expected {VPP} 1"]),
    # --pipeline_layer_costs
    "costs with vpp": (costs("1x8", vpp=2), [COSTS, "'1x8'", f"{VPP} is 2", f"expected {VPP} 1"]),
    "costs count": (costs("1,1,1"), [COSTS, "'1,1,1'", "gives 3 layer costs, but the model has 8", "one cost per layer"]),
    "costs fewer layers than stages": (costs("1,1", n=2, pp=4), [COSTS, "'1,1'", f"{PP} is 4", "at least one layer per stage"]),
    "costs infinite": (costs("1x7,inf"), [COSTS, "'1x7,inf'", "'inf'", "not finite", "finite cost >= 0"]),
    "costs nan": (costs("nanx8"), [COSTS, "'nanx8'", "not finite"]),
    "costs negative": (costs("-1,1x7"), [COSTS, "'-1,1x7'", "'-1'", "negative", "finite cost >= 0"]),
    "costs repeated tag": (costs("1x8,L:1,L:2"), [COSTS, "'1x8,L:1,L:2'", "tag 'L' is given more than once", "at most one"]),
    "costs unknown tag": (costs("1x8,X:1"), [COSTS, "'1x8,X:1'", "unknown tag 'X'", "expected E (embedding) or L"]),
    "costs not a number": (costs("1x7,fast"), [COSTS, "'fast'", "not a number", "'cxN'"]),
    "costs bad repeat": (costs("1x0,1x8"), [COSTS, "repeat count '0'", "positive integer"]),
    "costs empty entry": (costs("1x4,,1x4"), [COSTS, "empty entry at position 2"]),
    "costs only tags": (costs("E:1,L:2"), [COSTS, "'E:1,L:2'", "has no layer costs"]),
    # two options at once
    "two options": (lambda: resolve_layout(8, 2, partition="4,4", costs="1x8"),
                    [PART, "'4,4'", COSTS, "'1x8'", "at most one pipeline layout option"]),
    "two options chunks and megatron": (lambda: resolve_layout(4, 2, chunk_layout="0:2,1:2", megatron_layout="Ett|ttL"),
                                        [CHUNKS, MEG, "at most one"]),
    # --pipeline_chunk_layout
    "chunk malformed": (chunks("0:6,1"), [CHUNKS, "'0:6,1'", "chunk '1' is malformed", "STAGE:LAYERS"]),
    "chunk too many colons": (chunks("0:6:1,1:6"), [CHUNKS, "chunk '0:6:1' is malformed"]),
    "chunk non-integer stage": (chunks("a:6,1:6"), [CHUNKS, "'a' is not an integer", "stage number"]),
    "chunk negative layers": (chunks("0:13,1:-1"), [CHUNKS, "'-1' is not >= 0", "layer count"]),
    "chunk stage out of range": (chunks("0:6,2:6"), [CHUNKS, "'0:6,2:6'", "names stage 2", f"{PP} is 2"]),
    "chunk stage missing": (chunks("0:6,0:6"), [CHUNKS, "'0:6,0:6'", "no chunk on stage 1", "every stage"]),
    "chunk unequal": (chunks("0:4,1:4,0:4"), [CHUNKS, "'0:4,1:4,0:4'", "stage 0: 2, stage 1: 1", "same number of chunks"]),
    "chunk wrong sum": (chunks("0:4,1:4"), [CHUNKS, "'0:4,1:4'", "holds 8 layers, but the model has 12"]),
    "chunk vpp disagrees": (chunks("0:3,1:3,1:3,0:3", vpp=3), [CHUNKS, "gives 2 chunks per stage", f"{VPP} is 3", "agree"]),
    # --pipeline_model_parallel_layout
    "megatron unknown m": (megatron("Et|mt|tL"), [MEG, "'Et|mt|tL'", "unknown symbol 'm' at position 3", "MTP", "expected one of"]),
    "megatron unknown symbol": (megatron("Et|t?tL"), [MEG, "unknown symbol '?' at position 4"]),
    "megatron E twice": (megatron("Et|E|t|ttL"), [MEG, "E at position 3 appears a second time (first at position 0)"]),
    "megatron E repeated by group": (megatron("(Et)*2|ttL"), [MEG, "E at position 1 appears a second time (through a repeat)"]),
    "megatron E not first segment": (megatron("t|Et|ttL"), [MEG, "E at position 2 is in segment 1", "first segment"]),
    "megatron E after t": (megatron("tE|t|ttL"), [MEG, "E at position 1 is after a t", "before any t"]),
    "megatron E missing": (megatron("t|t|ttL"), [MEG, "has no E", "exactly once"]),
    "megatron L missing": (megatron("Et|t|tt"), [MEG, "has no L", "exactly once"]),
    "megatron L twice": (megatron("Et|tL|ttL"), [MEG, "L at position 8 appears a second time"]),
    "megatron L not last": (megatron("Et|ttLt"), [MEG, "L at position 5 is not the last symbol"]),
    "megatron N not before L": (megatron("Et|tNtL"), [MEG, "N at position 4 is not directly before L"]),
    "megatron N in early segment": (megatron("EtN|ttL"), [MEG, "N at position 2 is not directly before L"]),
    "megatron N twice": (megatron("Et|tNNL"), [MEG, "N at position 5 appears a second time"]),
    "megatron segments": (megatron("Et|t|ttL"), [MEG, "has 3 segments, but --pipeline_parallel is 2", "multiple of 2"]),
    "megatron t count": (megatron("Et|tttNL", n=5), [MEG, "'Et|tttNL'", "has 4 t, but the model has 5 layers"]),
    "megatron unclosed group": (megatron("Et|(t|ttL"), [MEG, "'(' is never closed at position 3", "matching ')'"]),
    "megatron stray paren": (megatron("Et|t)tL"), [MEG, "')' has no matching '(' at position 4"]),
    "megatron bad count": (megatron("Et|t*0tL"), [MEG, "'*' is followed by '0' at position 4", "positive repeat count"]),
    "megatron missing count": (megatron("Et|t*L"), [MEG, "'*' is followed by 'L' at position 4"]),
    "megatron star first": (megatron("*Et|tttL"), [MEG, "'*' has nothing to repeat at position 0"]),
    "megatron huge repeat": (megatron("Et*1000000000|L"), [MEG, "expands to more than"]),
    "megatron unicode digit": (megatron("Et|t*\u00b2L"), [MEG, "'*' is followed by '\u00b2' at position 4"]),
    "megatron deep nesting": (megatron("E" + "(" * 5000 + "t" + ")" * 5000 + "|tttL"), [MEG, "groups nest too deeply"]),
    "megatron vpp disagrees": (megatron("Et|t|t|tNL", vpp=3), [MEG, "gives 2 chunks per stage", f"{VPP} is 3"]),
    # sizes
    "pp zero": (lambda: resolve_layout(8, 0), [PP, "must be >= 1, got 0"]),
    "vpp zero": (lambda: resolve_layout(8, 2, 0), [VPP, "must be >= 1, got 0"]),
    "pp not an int": (lambda: resolve_layout(8, "2"), [PP, "must be an integer, got '2'"]),
}


@pytest.mark.parametrize("case", CASES)
def test_error_names_flag_value_and_expectation(case):
    build, fragments = CASES[case]
    with pytest.raises(LayoutError) as err:
        build()
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_layout_error_is_a_value_error():
    assert issubclass(LayoutError, ValueError)


@pytest.mark.parametrize("blank", [None, "", "  "])
def test_blank_options_mean_not_given(blank):
    assert resolve_layout(10, 2, 2, partition=blank, costs=blank, chunk_layout=blank,
                          megatron_layout=blank) == PipelineLayout.uniform(10, 2, 2)


def test_vpp_one_accepts_the_layout_strings_own_chunk_count():
    assert resolve_layout(4, 2, megatron_layout="Et|t|t|tNL").vpp == 2
    assert resolve_layout(4, 2, 2, megatron_layout="Et|t|t|tNL").vpp == 2
    assert resolve_layout(12, 2, chunk_layout="0:3,1:3,1:3,0:3").vpp == 2


def test_resolve_builds_each_option():
    assert resolve_layout(8, 2, costs="1x8,L:4.5").stage_layer_counts() == (6, 2)
    assert resolve_layout(8, 2, partition="3,5").stage_layer_counts() == (3, 5)
    assert resolve_layout(8, 2).stage_layer_counts() == (4, 4)
