"""One figure per tag x model of the history: tokens/s, peak memory and the self-check's margin
(the smaller of the loss and gradient margins, on a log axis: a drift towards 1x is a straight
fall) over the nights, one line per case. One figure per group, not per case, so a year of
nightlies of 200 cases is a handful of PNGs (the 2-second budget of docs/benchmarks.md)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402

from harness.report.plots import series_styles, slug  # noqa: E402,F401 (slug: the file names)

from .rows import HistoryRow  # noqa: E402
from .store import when  # noqa: E402

PANELS = (("tokens/s", "tokens_per_s", "linear"), ("peak MB", "peak_memory_mb", "linear"),
          ("margin (×, smaller of loss and gradients)", "margin", "log"))


def _value(row: HistoryRow, field: str) -> float | None:
    if field == "margin":
        found = [m for m in (row.loss_margin, row.gradient_margin)
                 if m is not None and math.isfinite(m) and m > 0]
        return min(found) if found else None
    value = getattr(row, field)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def group_figure(title: str, cases: dict[str, list[HistoryRow]], path: Path) -> Path | None:
    """The group's figure at `path`; None when no case has a number to draw."""
    drawn = {field: [(name, [(when(r), _value(r, field)) for r in rows
                             if _value(r, field) is not None])
                     for name, rows in sorted(cases.items())]
             for _, field, _ in PANELS}
    panels = [(label, field, scale) for label, field, scale in PANELS
              if any(points for _, points in drawn[field])]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels) + 0.6),
                             sharex=True, squeeze=False)
    styles = series_styles(len(cases))
    for ax, (label, field, scale) in zip(axes[:, 0], panels):
        for style, (name, points) in zip(styles, drawn[field]):
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, color=style["color"], linestyle=style["linestyle"],
                        marker=style["marker"] if len(points) <= 60 else None,
                        markersize=3, linewidth=1, label=name.split("/")[-1])
        ax.set_yscale(scale)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_title(title, fontsize=10)
    if len(cases) <= 20:
        axes[0, 0].legend(fontsize=6, ncol=4, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
