"""The history's figures drawn beside the text: what each figure draws (a group's points, in
plain floats), and the worker processes that draw them while the caller reads the history,
finds the findings and writes the tables.

Why a pool started before anything is read: on a machine of two cores a year's render is
mostly imports and figures, and matplotlib's import alone is a quarter of a second or more.
Workers forked first import it while the caller reads the history; what they then draw is sent
to them as points (a figure's cases' nights and values, not the rows: a year of rows is not
pickled). Nothing here imports matplotlib: the caller never needs it (plots.py is imported by
the workers, or on the first figure drawn in this process).
"""

from __future__ import annotations

import importlib
import math
import multiprocessing
import os
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from types import TracebackType

from .rows import HistoryRow
from .store import moment

# A case's points, per panel field: [(night, value)], the night in matplotlib's date numbers
# (days since 1970-01-01 UTC, its default epoch: date2num's value, without importing it).
CasePoints = dict[str, list[tuple[float, float]]]
Job = tuple[str, dict[str, CasePoints], Path]  # a figure: its title, its cases' points, its path
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@lru_cache(maxsize=8192)  # one per night: a year of 200 cases converts 365 dates, not 73,000
def night_number(date: str) -> float:
    return (moment(date) - _EPOCH).total_seconds() / 86400.0


def case_points(rows: list[HistoryRow]) -> CasePoints:
    """Each panel's (night, value) points of one case: tokens/s, peak MB, and the smaller of
    the two margins; what cannot be drawn (none, NaN, infinite, <= 0 on a log axis) left
    out. Plain comparisons, inline: a year of a group is 9,000 rows."""
    tokens, memory, margins = [], [], []
    for r in rows:
        x = night_number(r.date)
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


def _ready() -> None:
    """A worker's start: matplotlib imported before any figure is asked for."""
    importlib.import_module(".plots", __package__)


def _draw(job: Job) -> tuple[int, Path | None]:
    from .plots import group_figure

    return os.getpid(), group_figure(*job)


class Drawers:
    """`workers` processes (none for fewer than two: figures are then drawn in this process
    when their results are asked for), forked on entry and ended on every way out, an error in
    a figure or in the caller's own work included (Pool's exit terminates and joins them).
    Forked only from a process of one thread, the CLI: fork() in a threaded process can
    deadlock. Enter it before the history is read: the workers import matplotlib meanwhile."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = None

    def __enter__(self) -> Drawers:
        if self.workers >= 2:
            self._pool = multiprocessing.get_context("fork").Pool(
                self.workers, initializer=_ready)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.__exit__(kind, error, trace)  # terminate(), then join()

    def draw(self, jobs: list[Job]) -> Callable[[], list[tuple[int, Path | None]]]:
        """Every figure started; returns `finished()`, which waits for them and gives, in
        order, (the pid that drew it, its path or None: nothing to draw)."""
        if self._pool is None:
            return lambda: [_draw(job) for job in jobs]
        return self._pool.map_async(_draw, jobs, chunksize=1).get
