"""One figure per tag x model of the history: tokens/s, peak memory and the self-check's margin
(the smaller of the loss and gradient margins, on a log axis: a drift towards 1x is a straight
fall) over the nights, one line per case. One figure per group, not per case, so a year of
nightlies of 200 cases is a handful of PNGs.

Drawn for speed (the 2-second budget of docs/benchmarks.md#history-render): matplotlib's Figure
without pyplot (no figure manager, and pyplot's import is not paid), each panel's lines as one
LineCollection (a year of 25 cases is 75 lines: one artist per panel, not 75), the nights as
date numbers computed once per date (drawing.case_points), fixed margins instead of tight_layout (which
draws the figure a second time to measure it), and one figure per set of panels made once per
process and drawn again for each group (its axes and their ticks are a quarter of a figure's
time; tests/history/test_plots.py: each PNG byte for byte the one a new figure draws). The
CLI draws them in worker processes (drawing.Drawers), which import this module."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a CI runner
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from harness.styles import series_styles  # noqa: E402

# A case's points per panel field, [(night, value)] (drawing.case_points, which imports this
# module in the workers: named here again, not imported, so the two do not import each other)
CasePoints = dict[str, list[tuple[float, float]]]

PANELS = (("tokens/s", "tokens_per_s", "linear"), ("peak MB", "peak_memory_mb", "linear"),
          ("margin (×, smaller of loss and gradients)", "margin", "log"))
LEGEND_CASES = 20  # a legend of more cases than this hides the lines; the tables name them
MARKED_NIGHTS = 60  # a series this short has a marker on each night


# Per process: each set of panels' figure, made once and drawn again for every group that has
# those panels. Making a figure's axes and their ticks is about a quarter of drawing it; a
# group's own artists (its lines, markers, title and legend) are taken off before the next.
_CANVASES: dict[tuple, tuple[Figure, list]] = {}


def _canvas(panels: tuple) -> tuple[Figure, list]:
    if panels not in _CANVASES:
        fig = Figure(figsize=(9, 2.4 * len(panels) + 0.6), dpi=80)
        axes = list(fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0])
        for ax, (label, _, scale) in zip(axes, panels):
            ax.set_yscale(scale)
            if scale == "log":  # plain numbers (130, 200), minor ticks labelled within a decade
                ax.yaxis.set_major_formatter(LogFormatter())
                ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False,
                                                          minor_thresholds=(2, 0.5)))
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=7)
        locator = AutoDateLocator()
        axes[-1].xaxis.set_major_locator(locator)
        axes[-1].xaxis.set_major_formatter(ConciseDateFormatter(locator))
        fig.subplots_adjust(left=0.1, right=0.97, top=0.93, bottom=0.08, hspace=0.12)
        _CANVASES[panels] = fig, axes
    fig, axes = _CANVASES[panels]
    for ax in axes:  # the previous group's artists off, and its data limits forgotten
        for artist in [*ax.collections, *ax.lines]:
            artist.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        ax.relim()
    return fig, axes


def group_figure(title: str, cases: dict[str, CasePoints], path: Path) -> Path | None:
    """The group's figure at `path` from its cases' points (drawing.case_points); None when no
    case has a number to draw."""
    names = sorted(cases)
    per_case = [cases[name] for name in names]
    drawn = {field: [p[field] for p in per_case] for _, field, _ in PANELS}
    panels = tuple((label, field, scale) for label, field, scale in PANELS
                   if any(drawn[field]))
    if not panels:
        return None
    fig, axes = _canvas(panels)
    looks = series_styles(len(names))
    for ax, (_, field, _) in zip(axes, panels):
        lines = [(points, look) for points, look in zip(drawn[field], looks) if points]
        ax.add_collection(LineCollection(
            [points for points, _ in lines], colors=[look["color"] for _, look in lines],
            linestyles=[look["linestyle"] for _, look in lines], linewidths=1))
        for points, look in lines:
            if len(points) <= MARKED_NIGHTS:  # a few nights: each one marked
                xs, ys = zip(*points)
                ax.plot(xs, ys, linestyle="none", marker=look["marker"], markersize=3,
                        color=look["color"])
    for ax in axes:  # once every panel holds this group's data: the x axis is shared
        ax.autoscale_view()
    for ax, (_, field, scale) in zip(axes, panels):
        # One value on a panel: its range is set here, not by autoscaling, which pads a
        # single value differently on a reused canvas than on a new one (matplotlib 3.11:
        # 100-1000 against 150-150 on a log axis), so the two figures would differ.
        values = {y for points in drawn[field] if points for _, y in points}
        if len(values) == 1:
            (value,) = values
            ax.set_ylim(*((value / 2, value * 2) if scale == "log" and value > 0
                          else (value - (abs(value) or 1) / 2, value + (abs(value) or 1) / 2)))
    axes[0].set_title(title, fontsize=10, y=1.01)  # a y of its own: not placed by measuring
    if len(names) <= LEGEND_CASES:
        # a case's legend entry has its marker where its lines were drawn with markers
        marked = [any(0 < len(p[field]) <= MARKED_NIGHTS for _, field, _ in panels)
                  for p in per_case]
        handles = [Line2D([], [], color=look["color"], linestyle=look["linestyle"],
                          marker=look["marker"] if mark else None, markersize=3, linewidth=1)
                   for look, mark in zip(looks, marked)]
        axes[0].legend(handles, [n.split("/")[-1] for n in names], fontsize=6, ncol=4,
                       loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, pil_kwargs={"compress_level": 1})  # zlib's fastest: a year is 0.5 MB
    return path
