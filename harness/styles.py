"""The line styles every figure draws its series with (the report's and the history's), without
pyplot: matplotlib's colour maps only, so a module that draws with Figure alone (the history's
plots) does not pay pyplot's import."""

from __future__ import annotations

from matplotlib import colormaps

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")
_LINES = ("-", "--", "-.", ":")


def series_styles(n: int) -> list[dict]:
    """n distinct (colour, marker, line style) combinations: 20 colours (tab20, the dark shade
    of each hue first), each with its own marker; past 20 the line style changes too."""
    cmap = colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]  # 10 dark hues, then their light shades
    return [{"color": cmap(order[i % 20]), "marker": _MARKERS[i % len(_MARKERS)],
             "linestyle": _LINES[(i // 20) % len(_LINES)]} for i in range(n)]
