"""Reading numbers out of records and writing them into cells. Records write NaN / inf as the
strings "nan" / "inf" (JSON has neither), and any field may be null, so every access here is
tolerant and every formatter has a text for "not recorded"."""

from __future__ import annotations

import math
import re

# The cell formats the diff renderer shares with every section.
from harness.compare.render import NA, g, md_escape, number, tolerance_text  # noqa: F401


def slug(text: str) -> str:
    """A file-name-safe form of a case or model name (the figures' names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def section(record: dict, key: str) -> dict:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def whole(value) -> str:
    """Large counts (tokens/s, MB) as grouped integers: 18,432."""
    x = number(value)
    if x is None or not math.isfinite(x):
        return g(value)
    return f"{x:,.0f}"


def percent(ratio: float | None) -> str:
    """A ratio as a signed change: 1.188 -> +18.8%."""
    if ratio is None or not math.isfinite(ratio):
        return NA
    return f"{(ratio - 1) * 100:+.1f}%"
