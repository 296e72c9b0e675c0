"""Is a throughput difference real, or step-to-step noise? Each record holds its timed steps
(`step_times_ms`, every step after the first); the spread of a tokens/s ratio is taken from
them, and a difference is called only when it is outside that spread.

For one case with step times t_1..t_n (mean m, standard deviation s) the relative standard
error of its mean is s / (m sqrt(n)). The ratio of two cases' tokens/s has the relative
standard error sqrt(e_a^2 + e_b^2), and its band is two of those (about 95% for normal
noise). A ratio whose distance from 1 is inside the band is "within noise"; a case with fewer
than two timed steps has no spread, and its difference is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .values import number

BAND_SIGMAS = 2.0
NOT_JUDGED = "not judged (fewer than 2 timed steps)"
WITHIN_NOISE = "within noise"


def relative_error(record: dict) -> float | None:
    """The relative standard error of the case's mean step time; None without 2 timed steps."""
    raw = record.get("step_times_ms")
    times = [number(t) for t in raw] if isinstance(raw, list) else []
    times = [t for t in times if t is not None and math.isfinite(t) and t > 0]
    if len(times) < 2:
        return None
    mean = sum(times) / len(times)
    var = sum((t - mean) ** 2 for t in times) / (len(times) - 1)
    return math.sqrt(var) / mean / math.sqrt(len(times))


def spread_text(record: dict) -> str:
    """"±3.1%" (two standard errors of the mean step time, as a share), or "–"."""
    e = relative_error(record)
    return "–" if e is None else f"±{BAND_SIGMAS * e * 100:.1f}%"


@dataclass(frozen=True)
class Judgement:
    ratio: float  # b's tokens/s over a's
    band: float | None  # the ratio's noise band around 1, as a share (0.04: ±4%); None: unknown
    verdict: str  # "faster" | "slower" | WITHIN_NOISE | NOT_JUDGED

    @property
    def band_text(self) -> str:
        return "–" if self.band is None else f"±{self.band * 100:.1f}%"


def judge(a: dict, b: dict, ratio: float, floor: float = 0.0) -> Judgement:
    """b against a: "faster" / "slower" only when |ratio - 1| is outside the band (and at least
    `floor`, a minimum share a caller may add for noise the steps cannot show)."""
    ea, eb = relative_error(a), relative_error(b)
    if ea is None or eb is None:
        return Judgement(ratio, None, NOT_JUDGED)
    band = BAND_SIGMAS * math.sqrt(ea * ea + eb * eb)
    change = ratio - 1
    if abs(change) <= max(band, floor):
        return Judgement(ratio, band, WITHIN_NOISE)
    return Judgement(ratio, band, "faster" if change > 0 else "slower")
