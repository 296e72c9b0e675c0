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

# green (far below the threshold) through yellow (at it) to red (far above)
_CMAP = LinearSegmentedColormap.from_list("ratio", ["#1a9850", "#91cf60", "#fee08b",
                                                    "#fc8d59", "#d73027"]).with_extremes(
    bad="#d9d9d9")
RATIO_RANGE = (1e-2, 1e2)  # the colour scale; values beyond are drawn at its ends


def draw_grid(cases: Sequence[str], columns: Sequence[str], cells: dict[tuple[int, int], float],
              path: Path) -> Path:
    """cells: (case index, column index) -> the worst ratio (NaN or absent: not judged)."""
    values = np.full((len(cases), len(columns)), np.nan)
    for (i, j), ratio in cells.items():
        if ratio is not None and math.isfinite(ratio):
            values[i, j] = min(max(ratio, RATIO_RANGE[0]), RATIO_RANGE[1])
    left, right, bottom, top, cell = 2.8, 1.0, 1.9, 0.5, 0.25  # inches
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
