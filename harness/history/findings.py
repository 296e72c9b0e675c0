"""What the nights show that one night cannot: regressions found from each case's series.

- **Steps** in tokens/s or peak memory (`find_steps`). A night-to-night series is noisy, and a
  one-session comparison (report --compare) calls only what is outside one night's spread. Here a
  step is a change of level: the mean of the nights after a point against the median of the
  nights before it (robust to an old outlier), measured in units of the series' own noise. The noise is estimated from the
  series itself, robustly: the median absolute deviation of night-to-night differences (a step
  is one large difference among many small ones, and barely moves that median), or, where it is
  larger, the spread of the differences less the largest one (nights in modes: `series_noise`).
  A step is called when (1) it is at least STEP_Z standard errors of that difference, (2) at
  least MIN_STEP as a share (a change below that is not worth a line), (3) every night after it
  has moved at least half the step (one slow night is an outlier, not a step), and (4) every
  night after it is beyond the BEYOND quantile of the nights before (a run of nights at a level
  the series already visited, as a bimodal machine's are, is no step). Two nights after a
  point are the least a step is called on. The values are compared in log space: a step is a
  ratio. STEP_Z and (4) were chosen on synthetic series, normal and resampled from this
  machine's measured nights (docs/benchmarks.md#history, benchmarks/history_detection.py):
  at 1% noise a 5% step is found by its third night in 98% of series; no threshold can find it
  that soon in this VM's 7-30% noise, and there the rules keep quiet instead.
- **Drift**: a margin (threshold / worst, the self-check's loss or gradient margin) that keeps
  falling over consecutive passed nights while the case still passes (`find_drift`): over the
  last DRIFT_NIGHTS passed nights at least DRIFT_MIN_NIGHTS with a finite margin, a Kendall
  tau of at most DRIFT_TAU (mostly falling night after night) and a fall of at least
  DRIFT_FACTOR from the first of them to the last.
- **Flaky or broken** (`status_changes`): a build whose nights include both passed and failed
  (the same code giving both verdicts) is flaky; a case whose nights were passed up to one
  build and failed from it on, every night, broke at that build (its first failed night named).

`since(rows, days)` keeps what started within the last `days` of the newest night: the nightly
report's "Since last week".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .rows import HistoryRow
from .store import when

STEP_Z = 4.0  # standard errors; see the module docstring and benchmarks/history_detection.py
MIN_STEP = 0.02  # as a share
BEFORE, AFTER = 14, 7  # nights on each side the medians are taken over
MIN_BEFORE, MIN_AFTER = 5, 2
BEYOND = 0.1  # the quantile of the nights before that every night after must pass
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)  # a median's standard error over a mean's (normal)
DRIFT_NIGHTS, DRIFT_MIN_NIGHTS, DRIFT_TAU, DRIFT_FACTOR = 10, 5, -0.6, 4.0
BAD = ("failed", "error")
RAN = ("passed", "failed", "ran")  # the nights whose throughput counts
METRICS = {"tokens_per_s": "tokens/s", "peak_memory_mb": "peak memory"}
MARGINS = {"loss_margin": "loss margin", "gradient_margin": "gradient margin"}


def series_noise(logs: np.ndarray) -> float:
    """The standard deviation of one night's value, in log units, from the night-to-night
    differences: the larger of two estimates, each blind to one step (one large difference
    among many small ones). The median absolute deviation is right for normal noise; the root
    mean square of the differences less the largest one is right where the nights fall into
    modes (a shared VM's tokens/s, measured: two levels 40% apart), whose many near-zero
    differences within a mode pull the median down."""
    if len(logs) < 3:
        return 0.0
    diffs = np.diff(logs)
    mad = np.median(np.abs(diffs - np.median(diffs)))
    rest = np.sort(np.abs(diffs))[:-1]
    return max(float(1.4826 * mad), float(np.sqrt(np.mean(rest ** 2)))) / math.sqrt(2)


@dataclass(frozen=True)
class StepAt:
    index: int  # the first night of the new level
    ratio: float  # the level after over the level before
    z: float  # in standard errors of the difference of the two levels


def _levels(x: np.ndarray, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                      np.ndarray]:
    """For every candidate night t in [t0, t1): the median of the up to BEFORE nights before it,
    the mean of the up to AFTER nights from it on, and how many nights each was taken over.
    The windows are whole (BEFORE and AFTER nights) in the middle of a series: those are taken
    in one vectorized pass; only the few cut short at its ends are taken one by one."""
    n = len(x)
    t = np.arange(t0, t1)
    n_before = np.minimum(t, BEFORE)
    n_after = np.minimum(n - t, AFTER)
    base, level = np.empty(len(t)), np.empty(len(t))
    whole = (t >= BEFORE) & (t + AFTER <= n)
    if whole.any():
        first, last = int(t[whole][0]), int(t[whole][-1])
        base[whole] = np.median(sliding_window_view(x[first - BEFORE:last], BEFORE), axis=1)
        level[whole] = sliding_window_view(x[first:last + AFTER], AFTER).mean(axis=1)
    # The windows cut short (up to BEFORE + AFTER per series): as Python floats, since numpy's
    # per-call cost on a dozen values was most of a year's findings (400 series x 17 calls).
    values = x.tolist()
    for i in np.flatnonzero(~whole).tolist():
        k = int(t[i])
        base[i] = statistics.median(values[k - int(n_before[i]):k])
        after = values[k:k + int(n_after[i])]
        level[i] = sum(after) / len(after)
    return base, level, n_before, n_after


def find_steps(values: list[float], *, z_min: float = STEP_Z, floor: float = MIN_STEP
               ) -> list[StepAt]:
    """Every step in a series (oldest first), strongest first among overlapping candidates."""
    x = np.log(np.asarray(values, dtype=float))
    n = len(x)
    if n < MIN_BEFORE + MIN_AFTER:
        return []
    sigma = series_noise(x)
    t0 = MIN_BEFORE
    base, level, n_before, n_after = _levels(x, t0, n - MIN_AFTER + 1)
    shift = level - base
    se = sigma * np.sqrt(1 / n_after + MEDIAN_EFFICIENCY ** 2 / n_before)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, np.abs(shift) / np.where(se > 0, se, 1.0), math.inf)
    candidates = []
    for i in np.flatnonzero((np.abs(shift) >= math.log1p(floor)) & (z >= z_min)):
        t, move = t0 + int(i), float(shift[i])
        after, before = x[t:t + AFTER], x[max(0, t - BEFORE):t]
        if not np.all((after - base[i]) * math.copysign(1, move) > abs(move) / 2):
            continue
        # beyond what the nights before already reached: a slowdown below their 10th
        # percentile, a rise above their 90th (a run of nights in a mode seen before is no
        # step)
        edge = np.quantile(before, BEYOND if move < 0 else 1 - BEYOND)
        if np.all(after < edge) if move < 0 else np.all(after > edge):
            candidates.append(StepAt(t, math.exp(move), float(z[i])))
    chosen: list[StepAt] = []
    for c in sorted(candidates, key=lambda c: (-c.z, c.index)):
        if all(abs(c.index - k.index) >= AFTER for k in chosen):
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.index)


def kendall_tau(values: list[float]) -> float:
    """Kendall's tau of the values against their order (-1: falling every time)."""
    n = len(values)
    if n < 2:
        return 0.0
    s = sum(math.copysign(1, values[j] - values[i]) if values[j] != values[i] else 0
            for i in range(n) for j in range(i + 1, n))
    return s / (n * (n - 1) / 2)


@dataclass(frozen=True)
class Finding:
    kind: str  # "step" | "drift" | "flaky" | "broke" | "fixed"
    config: str
    machine: str | None
    name: str
    row: HistoryRow  # the night it starts (a drift: its first night)
    text: str  # one line, the case and the build named

    @property
    def line(self) -> str:
        return f"`{self.name}`: {self.text}"


def _g(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.3g}"


def _night(row: HistoryRow) -> str:
    return f"{row.date[:10]} (session {row.session}, build {row.build_label})"


SeriesOf = dict[tuple, list[HistoryRow]]  # (config, machine, case) -> its rows, oldest first


def _series(rows: list[HistoryRow]) -> SeriesOf:
    """One series per (config, machine, case), oldest first; sessions of one config and machine
    only, so another config or a machine change is never a step."""
    groups: dict[tuple, list[HistoryRow]] = {}
    for row in sorted(rows, key=lambda r: (when(r), r.session)):
        groups.setdefault((row.config, row.machine, row.name), []).append(row)
    return groups


def metric_steps(rows: list[HistoryRow], series_of: SeriesOf | None = None) -> list[Finding]:
    found = []
    for (config, machine, name), series in (series_of or _series(rows)).items():
        for field, label in METRICS.items():
            points, values = [], []  # the nights that ran with a number, in one pass
            for r in series:
                v = getattr(r, field)
                if v is not None and 0 < v < math.inf and r.status in RAN:
                    points.append(r)
                    values.append(v)
            for step in find_steps(values):
                row = points[step.index]
                worse = step.ratio < 1 if field == "tokens_per_s" else step.ratio > 1
                text = (f"{label} {'fell' if step.ratio < 1 else 'rose'} "
                        f"{abs(step.ratio - 1) * 100:.1f}% from {_night(row)} "
                        f"({step.z:.1f} standard errors of the series' noise"
                        f"{'' if worse else '; an improvement'})")
                found.append(Finding("step", config, machine, name, row, text))
    return found


def find_drift(margins: list[float]) -> tuple[int, float, float] | None:
    """(index of the first night, first margin, last margin) when the margins (the last passed
    nights, oldest first) keep falling; None otherwise."""
    finite = [(i, m) for i, m in enumerate(margins) if m is not None and math.isfinite(m)
              and m > 0]
    if len(finite) < DRIFT_MIN_NIGHTS:
        return None
    values = [m for _, m in finite]
    if kendall_tau(values) > DRIFT_TAU or values[0] < DRIFT_FACTOR * values[-1]:
        return None
    return finite[0][0], values[0], values[-1]


def margin_drift(rows: list[HistoryRow], series_of: SeriesOf | None = None) -> list[Finding]:
    found = []
    for (config, machine, name), series in (series_of or _series(rows)).items():
        recent: list[HistoryRow] = []
        for row in reversed(series):  # the newest run of passed nights
            if row.status != "passed":
                break
            recent.insert(0, row)
        recent = recent[-DRIFT_NIGHTS:]
        for field, label in MARGINS.items():
            drift = find_drift([getattr(r, field) for r in recent])
            if drift:
                first, old, new = drift
                row = recent[first]
                text = (f"{label} fell from {_g(old)}x to {_g(new)}x over "
                        f"{len(recent) - first} passed nights since {_night(row)}; "
                        f"still passing")
                found.append(Finding("drift", config, machine, name, row, text))
    return found


def status_changes(rows: list[HistoryRow], series_of: SeriesOf | None = None) -> list[Finding]:
    found = []
    for (config, machine, name), series in (series_of or _series(rows)).items():
        judged = [r for r in series if r.status in ("passed", *BAD)]
        builds: dict[str, list[HistoryRow]] = {}
        for row in judged:
            builds.setdefault(row.build_label, []).append(row)
        for build, nights in builds.items():
            statuses = {"failed" if r.status in BAD else "passed" for r in nights}
            if len(statuses) == 2:
                bad = sum(r.status in BAD for r in nights)
                first_bad = next(r for r in nights if r.status in BAD)
                found.append(Finding(
                    "flaky", config, machine, name, first_bad,
                    f"flaky: build {build} both passed and failed ({bad} of {len(nights)} "
                    f"nights failed, first {_night(first_bad)}): {first_bad.reason or ''}"
                    .rstrip(": ")))
        order = list(builds)  # builds in the order they first ran
        consistent = [(b, {r.status in BAD for r in builds[b]}) for b in order]
        for i in range(1, len(consistent)):
            (_, before), (build, now) = consistent[i - 1], consistent[i]
            if len(before) != 1 or len(now) != 1 or before == now:
                continue
            row = builds[build][0]
            if now == {True} and all(s == {True} for _, s in consistent[i:]):
                found.append(Finding("broke", config, machine, name, row,
                                     f"broke at build {build}: failed every night since "
                                     f"{_night(row)}: {row.reason or 'no reason recorded'}"))
            elif now == {False} and all(s == {False} for _, s in consistent[i:]):
                found.append(Finding("fixed", config, machine, name, row,
                                     f"passes again since build {build}, {_night(row)}"))
    return found


def all_findings(rows: list[HistoryRow]) -> list[Finding]:
    series_of = _series(rows)  # once: a year of nights is 73,000 rows to sort
    return sorted(status_changes(rows, series_of) + margin_drift(rows, series_of)
                  + metric_steps(rows, series_of), key=lambda f: (when(f.row), f.name, f.kind))


def since(rows: list[HistoryRow], days: float = 7.0, found: list[Finding] | None = None
          ) -> list[Finding]:
    """What started within `days` of the newest night (a drift still going on counts); of
    `found` when the rows' findings are at hand (all_findings(rows)), else found now."""
    if not rows:
        return []
    newest = max(map(when, rows))
    start = newest - timedelta(days=days)
    found = all_findings(rows) if found is None else found
    return [f for f in found if f.kind == "drift" or when(f.row) > start]


def last_change(series: list[HistoryRow]) -> HistoryRow | None:
    """The night the case last changed status (between passed and failed / error, or to or
    from skipped), None when it never did. Looked for from the newest night back: a year's
    series mostly changed last near its end, or never."""
    for i in range(len(series) - 1, 0, -1):
        older, newer = series[i - 1], series[i]
        if older.status != newer.status and _verdict(older) != _verdict(newer):
            return newer
    return None


def _verdict(row: HistoryRow) -> str:
    return "failed" if row.status in BAD else row.status
