"""The history's figures: one figure per set of panels is made once per process and drawn again
for every group (plots._canvas); what a group leaves on it must not reach the next one."""

from __future__ import annotations

import math

from harness.history import plots
from harness.history.drawing import case_points

from .nights import row


def _group(cases: int, nights: int, **values) -> dict:
    """The points of `cases` cases of `nights` nights each, their tokens/s apart and moving night
    to night."""
    return {f"basic/gpt2/c{c}": case_points([row(i, name=f"basic/gpt2/c{c}", **{
        "tokens_per_s": 1000.0 * (c + 1) + 50 * math.sin(i + c), **values})
        for i in range(nights)]) for c in range(cases)}


def test_a_figure_drawn_on_a_reused_canvas_is_the_figure_drawn_fresh(tmp_path):
    """Groups of every shape, one after another on the reused canvases, each byte for byte the
    PNG drawn on a new figure. Plants: the data limits not forgotten (`ax.relim()` left out: a
    short group keeps the long one's x range), the lines or the legend not taken off."""
    groups = [
        _group(25, 70),  # a long series, no markers, too many cases for a legend
        _group(3, 5),  # a few nights: markers, and a legend
        _group(2, 8, loss_margin=None, gradient_margin=None),  # no margin panel
        _group(4, 1),  # one night
        _group(3, 5, peak_memory_mb=2000.0, loss_margin=5.0),  # other levels, same panels
        _group(25, 70),
    ]
    reused = [plots.group_figure(f"g{i}", cases, tmp_path / f"reused{i}.png")
              for i, cases in enumerate(groups)]
    fresh = []
    for i, cases in enumerate(groups):
        plots._CANVASES.clear()
        fresh.append(plots.group_figure(f"g{i}", cases, tmp_path / f"fresh{i}.png"))
    differ = [i for i, (a, b) in enumerate(zip(reused, fresh))
              if a.read_bytes() != b.read_bytes()]
    assert differ == []
    assert len({p.read_bytes() for p in fresh}) == len(groups)  # each group drew its own


def test_a_group_with_nothing_to_draw_has_no_figure_and_spoils_none(tmp_path):
    nothing = _group(2, 3, tokens_per_s=None, peak_memory_mb=None, loss_margin=None,
                     gradient_margin=math.nan)
    assert plots.group_figure("none", nothing, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    after = plots.group_figure("g", _group(3, 5), tmp_path / "after.png")
    plots._CANVASES.clear()
    alone = plots.group_figure("g", _group(3, 5), tmp_path / "alone.png")
    assert after.read_bytes() == alone.read_bytes()
