"""Fuzzed layout strings through resolve_layout, as the trainer calls it: each one is accepted
and satisfies the layout invariants, or is refused with LayoutError naming its flag; no other
exception type, ever."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.layout import LayoutError, resolve_layout

from .invariants import check_layout

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FLAGS = {
    "partition": "--pipeline_layer_partition",
    "costs": "--pipeline_layer_costs",
    "chunk_layout": "--pipeline_chunk_layout",
    "megatron_layout": "--pipeline_model_parallel_layout",
}
# Pieces of each grammar (valid and nearly valid), glued at random, plus arbitrary text.
PIECES = {
    "partition": ["1", "2", "3", "4", "0", "-1", "10", ",", ",", " ", "+2", "2.5", "x", "1_0",
                  "\u0663", "99999999999999999999"],
    "costs": ["1", "0.5", "4.5", "0", "x", "x8", "x2", "x0", "x-1", ",", ",", "E:", "L:", "Q:",
              ":", "inf", "nan", "-1", "1e3", "1e400", " ", "e", "1x99999999999"],
    "chunk_layout": ["0", "1", "2", "3", ":", ":", ",", ",", "-1", " ", "4", "1:2", "0:0", "x",
                     "99999999999999999999"],
    "megatron_layout": ["E", "t", "t", "t", "N", "L", "|", "|", "*", "2", "3", "0", "(", ")",
                        "(t|)*2", "t*3", "|*2", " ", ",", "m", "x", "**", "*-1", "*99999"],
}


def texts(option: str):
    glued = st.lists(st.sampled_from(PIECES[option]), max_size=14).map("".join)
    return st.one_of(glued, glued, st.text(max_size=12))


@st.composite
def layout_requests(draw):
    option = draw(st.sampled_from(sorted(FLAGS)))
    num_layers = draw(st.integers(1, 12))
    pp = draw(st.integers(1, 4))
    vpp = draw(st.sampled_from([1, 1, 2, 3]))
    return option, num_layers, pp, vpp, draw(texts(option))


def resolve_or_refuse(option, num_layers, pp, vpp, text):
    try:
        layout = resolve_layout(num_layers, pp, vpp, **{option: text})
    except LayoutError as error:
        message = str(error)
        assert "\n" not in message and message
        blank = not text.strip()
        assert blank or FLAGS[option] in message or "--pipeline_parallel" in message \
            or "--virtual_pipeline_parallel" in message, message
        return None
    check_layout(layout, num_layers, pp)
    if option in ("partition", "costs") and text.strip():
        assert layout.vpp == 1
    if not text.strip():  # a blank option counts as not given: the uniform split
        assert layout.vpp == vpp
    return layout


@FUZZ
@given(layout_requests())
def test_fuzzed_layout_strings_are_accepted_valid_or_refused_by_name(request):
    resolve_or_refuse(*request)


@st.composite
def near_valid_megatron(draw):
    """A valid Megatron string from random chunk sizes, then maybe one character changed."""
    pp = draw(st.integers(1, 4))
    vpp = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp))
    segments = ["t" * n for n in sizes]
    segments[0] = "E" + segments[0]
    segments[-1] += draw(st.sampled_from(["NL", "L"]))
    text = "|".join(segments)
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from("EtNL|()*2 m")) + text[at + 1:]
    return "megatron_layout", max(1, sum(sizes)) + draw(st.sampled_from([0, 0, 1])), pp, vpp, text


@FUZZ
@given(near_valid_megatron())
def test_near_valid_megatron_strings(request):
    resolve_or_refuse(*request)


@st.composite
def near_valid_chunks(draw):
    pp = draw(st.integers(1, 4))
    vpp = draw(st.integers(1, 3))
    stages = draw(st.permutations([g % pp for g in range(pp * vpp)]))
    sizes = draw(st.lists(st.integers(0, 3), min_size=pp * vpp, max_size=pp * vpp))
    entries = [f"{s}:{n}" for s, n in zip(stages, sizes)]
    if entries and draw(st.booleans()):
        del entries[draw(st.integers(0, len(entries) - 1))]
    return "chunk_layout", max(1, sum(sizes)), pp, draw(st.sampled_from([1, vpp])), ",".join(entries)


@FUZZ
@given(near_valid_chunks())
def test_near_valid_chunk_layouts(request):
    layout = resolve_or_refuse(*request)
    if layout is not None and request[-1]:
        assert layout.to_chunk_layout() == request[-1].replace(" ", "")
