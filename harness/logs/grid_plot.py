"""The archive's picture: cases x nights, each cell coloured by the worst |diff| over the limit it
was judged by (log scale, 1 = the threshold: green below, red above), grey where the case was
not judged that night. Drawn with matplotlib's Figure (no pyplot), once per sweep."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # no display on a CI runner
from matplotlib.colors import LinearSegmentedColormap, LogNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
import numpy as np  # noqa: E402

# greens below the threshold, reds above it, a break at 1 (the middle of RATIO_RANGE on a log
# scale): a case just over its limit reads as red at a glance, one just under as green
_CMAP = LinearSegmentedColormap.from_list("ratio", [
    (0.0, "#1a9850"), (0.4999, "#d9ef8b"), (0.5, "#fdae61"), (1.0, "#a50026")]).with_extremes(
    bad="#d9d9d9")
RATIO_RANGE = (1e-2, 1e2)  # the colour scale; values beyond are drawn at its ends


def draw_grid(cases: Sequence[str], columns: Sequence[str], cells: dict[tuple[int, int], float],
              path: Path) -> Path:
    """cells: (case index, column index) -> the worst ratio (NaN or absent: not judged)."""
    values = np.full((len(cases), len(columns)), np.nan)
    for (i, j), ratio in cells.items():
        if ratio is not None and math.isfinite(ratio):
            values[i, j] = min(max(ratio, RATIO_RANGE[0]), RATIO_RANGE[1])
    # inches: the labels' room from their length (about 0.06 in a character at 6-7 points)
    left = 0.4 + 0.065 * max(map(len, cases))
    bottom = 0.4 + 0.055 * max(map(len, columns))
    right, top, cell = 1.0, 0.5, 0.25
    width = min(left + right + cell * max(len(columns), 4), 60.0)
    height = min(bottom + top + cell * max(len(cases), 2), 60.0)
    figure = Figure(figsize=(width, height), dpi=100)
    axes = figure.add_axes((left / width, bottom / height, (width - left - right) / width,
                            (height - bottom - top) / height))
    image = axes.imshow(np.ma.masked_invalid(values), cmap=_CMAP, aspect="auto",
                        norm=LogNorm(*RATIO_RANGE), interpolation="nearest")
    axes.set_yticks(range(len(cases)), cases, fontsize=7)
    step = max(1, len(columns) // 40)  # at most 40 night labels
    axes.set_xticks(range(0, len(columns), step), columns[::step], fontsize=6, rotation=90)
    figure.text(0.02, 1 - 0.15 / height, "worst |diff| / limit (1: the threshold; grey: not "
                "judged)", fontsize=7, va="top")
    bar = figure.add_axes(((width - right + 0.15) / width, bottom / height, 0.15 / width,
                           (height - bottom - top) / height))
    colorbar = figure.colorbar(image, cax=bar)
    colorbar.ax.tick_params(labelsize=6)
    figure.savefig(path)
    return path
