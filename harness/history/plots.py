"""One figure per tag x model of the history: tokens/s, peak memory and the self-check's margin
(the smaller of the loss and gradient margins, on a log axis: a drift towards 1x is a straight
fall) over the nights, one line per case. One figure per group, not per case, so a year of
nightlies of 200 cases is a handful of PNGs.

Drawn for speed (the 2-second budget of docs/benchmarks.md section 12): matplotlib's Figure
without pyplot (no figure manager, and pyplot's import is not paid), each panel's lines as one
LineCollection (a year of 25 cases is 75 lines: one artist per panel, not 75), the nights as
matplotlib date numbers computed once per date, fixed margins instead of tight_layout (which
draws the figure a second time to measure it), and one figure per set of panels made once per
process and drawn again for each group (its axes and their ticks are a quarter of a figure's
time; tests/history/test_plots.py: each PNG byte for byte the one a new figure draws)."""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a CI runner
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from harness.report.styles import series_styles  # noqa: E402

from .rows import HistoryRow  # noqa: E402
from .store import moment  # noqa: E402

PANELS = (("tokens/s", "tokens_per_s", "linear"), ("peak MB", "peak_memory_mb", "linear"),
          ("margin (×, smaller of loss and gradients)", "margin", "log"))
LEGEND_CASES = 20  # a legend of more cases than this hides the lines; the tables name them
MARKED_NIGHTS = 60  # a series this short has a marker on each night


def _points(rows: list[HistoryRow]) -> dict[str, list[tuple[float, float]]]:
    """Each panel's (night, value) points of one case: tokens/s, peak MB, and the smaller of
    the two margins; what cannot be drawn (none, NaN, infinite, <= 0 on a log axis) left
    out. Plain comparisons, inline: a year of a group is 9,000 rows."""
    tokens, memory, margins = [], [], []
    for r in rows:
        x = _x(r.date)
        value = r.tokens_per_s
        if value is not None and 0 < value < math.inf:  # NaN fails both
            tokens.append((x, value))
        value = r.peak_memory_mb
        if value is not None and 0 < value < math.inf:
            memory.append((x, value))
        loss, grad = r.loss_margin, r.gradient_margin
        loss = loss if loss is not None and 0 < loss < math.inf else None
        grad = grad if grad is not None and 0 < grad < math.inf else None
        if loss is not None or grad is not None:
            margins.append((x, loss if grad is None else grad if loss is None
                            else min(loss, grad)))
    return {"tokens_per_s": tokens, "peak_memory_mb": memory, "margin": margins}


@lru_cache(maxsize=8192)  # one per night: a year of 200 cases converts 365 dates, not 73,000
def _x(date: str) -> float:
    return float(date2num(moment(date)))


Job = tuple[str, dict, Path]  # group_figure's arguments: title, cases, path
_JOBS: list[Job] = []  # the jobs of drawing's forked workers (inherited, not pickled)


def _draw(index: int) -> tuple[int, Path | None]:
    return os.getpid(), group_figure(*_JOBS[index])


@contextmanager
def drawing(jobs: list[Job], workers: int = 1) -> Iterator[Callable[[], list]]:
    """Every figure started, over `workers` forked processes when more than one, while the
    caller goes on; yields `finished()`, which waits for them and gives, in order, (the pid
    that drew it, its path or None). The figures are independent, and a year's are most of
    the render's time. The workers inherit the jobs (a year of rows is not pickled), and the
    pool is ended on every way out, an error in a figure or in the caller's own work included
    (Pool's exit terminates and joins them). Forked only from a process of one thread, the
    CLI: fork() in a threaded process can deadlock. With one worker, `finished()` draws
    them."""
    global _JOBS
    workers = min(workers, len(jobs))
    if workers < 2:
        yield lambda: [(os.getpid(), group_figure(*job)) for job in jobs]
        return
    _JOBS = jobs
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            pending = pool.map_async(_draw, range(len(jobs)), chunksize=1)
            yield pending.get
    finally:
        _JOBS = []


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


def group_figure(title: str, cases: dict[str, list[HistoryRow]], path: Path) -> Path | None:
    """The group's figure at `path`; None when no case has a number to draw."""
    names = sorted(cases)
    per_case = [_points(cases[name]) for name in names]
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
