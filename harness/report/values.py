"""Reading numbers out of records and writing them into cells. Records write NaN / inf as the
strings "nan" / "inf" (JSON has neither), and any field may be null, so every access here is
tolerant and every formatter has a text for "not recorded"."""

from __future__ import annotations

import math

NA = "–"  # a cell with nothing recorded


def number(value) -> float | None:
    """A float from a record value: numbers, "nan" / "inf" strings; None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def section(record: dict, key: str) -> dict:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def g(value, digits: int = 3) -> str:
    x = number(value)
    if x is None:
        return NA
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


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


def tolerance_text(tol) -> str:
    if not isinstance(tol, dict):
        return NA
    atol, rtol = number(tol.get("atol")), number(tol.get("rtol"))
    if atol is None:
        return NA
    return f"atol {atol:g}, rtol {rtol or 0:g}"


def md_escape(text) -> str:
    """Pipes and newlines would break a markdown table row."""
    return str(text).replace("|", "\\|").replace("\n", " ")
