"""PNG figures beside the markdown (matplotlib, Agg: CI has no display).

- loss per model: the reference curve, and each case's |loss - reference| per step on a log
  scale against the loss tolerance, so a drift shows before it crosses the line;
- the verdict picture (`verdict_figure`, below): every parameter's scale-free gradient error
  by layer, over the case's pipeline stages, against the threshold and the noise floor; for
  each failing case and the closest passing case of each (tag, model), written beside the loss
  figure of their model (`loss_figure` is the report's one call per model);
- gradient error of a failed case: max |got - ref| per layer (the record's `per_layer`
  summary: every layer, embedding and head included), or, in records without it, per recorded
  worst parameter; ordered by layer, coloured by pipeline stage, against the gradient tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from harness.compare.locate import Locator, canonical_name, layer_of  # noqa: E402
from harness.results.values import g, number, section, slug  # noqa: E402
from harness.styles import series_styles  # noqa: E402

from .case_view import CaseView  # noqa: E402
from .steps import reference_steps, run_steps  # noqa: E402

_TINY = 1e-12  # a log axis cannot show an exact 0 difference


def _series(values) -> list[float | None]:
    return [number(v) for v in values] if isinstance(values, list) else []




def reference_line(references: list[list[tuple[int, float | None]]]
                   ) -> list[tuple[int, float | None]]:
    """One grey line from the cases' references, by step: the longest reference's values, and
    the steps only another reference covers (a resumed run's reference starts late); a step
    only ever recorded as missing stays a gap."""
    line: dict[int, float | None] = {}
    for ref in sorted(references, key=len, reverse=True):
        for step, value in ref:
            if line.get(step) is None:
                line[step] = value
    return sorted(line.items())


def loss_figure(model: str, cases: list[CaseView], path: Path) -> Path | None:
    """None when no case of the model recorded both its losses and its reference's.

    Every loss is drawn at its own step (harness.report.steps: a resumed run's first loss is
    its checkpoint's step + 1, not 1).

    Top: the reference as a grey line, each run's loss as its own hollow marker and colour at
    the exact step, one size smaller per run (runs that match show as concentric rings on it). Bottom: |loss - reference| per step on a log
    axis against the tolerance; series are spread a little along x so coincident points stay
    visible; an exact 0 is drawn on the labelled "exactly 0" row at the bottom."""
    plotted = []
    for c in cases:  # (case, [(step, loss)], [(step, reference loss)]), at the steps recorded
        got = list(zip(run_steps(c.record), _series(c.record.get("losses"))))
        ref = list(zip(reference_steps(c.record), _series(c.record.get("reference_losses"))))
        if got and ref:
            plotted.append((c, got, ref))
    if not plotted:
        return None
    styles = series_styles(len(plotted))
    rows = max(6.5, 3.2 + 0.18 * len(plotted))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, rows), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.3]})
    reference = reference_line([ref for _, _, ref in plotted])
    top.plot([s for s, _ in reference], [math.nan if v is None else v for _, v in reference],
             color="0.6", lw=2.5, zorder=1, label="single-device reference")
    diffs_of = []  # per case: [(step, |loss - reference|)], NaN where either is missing
    for case, got, ref in plotted:
        at = dict(ref)
        diffs_of.append([(step, abs(v - at[step]) if v is not None and at.get(step) is not None
                          else math.nan) for step, v in got])
    nonzero = [d for diffs in diffs_of for _, d in diffs if d == d and d > 0]
    floor = min(nonzero) / 100 if nonzero else 1e-12
    spread = 0.3 / max(1, len(plotted) - 1) if len(plotted) > 1 else 0.0
    tolerances = set()
    for k, ((case, got, _), diffs, style) in enumerate(zip(plotted, diffs_of, styles)):
        label = f"{case.case_id} ({case.status})"
        dx = (k - (len(plotted) - 1) / 2) * spread
        line = dict(style, markersize=5, markerfacecolor="none" if k % 2 else style["color"],
                    lw=1.0 if case.status == "passed" else 2.0)
        # Top: at the exact step, hollow and one size smaller per run, so runs that match the
        # reference show as concentric rings on it.
        top.plot([step for step, _ in got], [math.nan if v is None else v for _, v in got],
                 linestyle="none", marker=style["marker"], markerfacecolor="none",
                 markeredgecolor=style["color"], markeredgewidth=1.2,
                 markersize=5 + min(1.2, 16 / len(plotted)) * (len(plotted) - 1 - k),
                 zorder=2 + k)
        bottom.plot([step + dx for step, _ in diffs],
                    [max(d, floor) if d == d else math.nan for _, d in diffs], label=label,
                    **line)
        atol = number(section(section(case.record, "tolerances"), "loss").get("atol"))
        if atol:
            tolerances.add(atol)
    bottom.set_yscale("log")
    for atol in sorted(tolerances):
        bottom.axhline(atol, color="red", lw=1.2, ls=(0, (4, 2)), label=f"loss atol {atol:g}")
    bottom.axhline(floor, color="0.6", lw=0.8, zorder=0)
    ticks = [t for t in bottom.get_yticks() if t > floor * 10]
    bottom.set_yticks([floor, *ticks])
    bottom.set_yticklabels(["exactly 0", *(f"{t:.0e}" for t in ticks)])
    bottom.set_ylim(floor / 3, max([*tolerances, *nonzero, floor]) * 5)
    top.set_ylabel("loss")
    top.set_title(f"{model}: loss per step, {len(plotted)} runs against the single-device "
                  "reference (grey line; one ring per run)", fontsize=10)
    top.legend(fontsize=7, loc="upper right")
    bottom.set_ylabel("|loss − reference|")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("step (runs spread slightly along x so overlapping points stay visible)")
    bottom.legend(fontsize=7, ncol=1 if len(plotted) <= 20 else 2, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), title="run (marker in both panels)",
                  title_fontsize=7)
    return _save(fig, path)


def divergence_figure(model: str, cases: list, path: Path) -> Path | None:
    """The loss against the baseline, step by step, for each case of `model` with a judged
    baseline (harness.report.baseline.Divergence): |run - baseline| as a share of what the
    verdict allows at that step, on a log axis, against the line at 1 where a step diverges; an
    exact 0 is drawn on the "exactly 0" row. None when no case has one."""
    cases = [c for c in cases if c.steps]
    if not cases:
        return None
    nonzero = [r for c in cases for r in c.ratios if r == r and r > 0]
    floor = min([*nonzero, 1.0]) / 100
    fig, axis = plt.subplots(figsize=(11, max(4.0, 2.5 + 0.18 * len(cases))))
    for case, style in zip(cases, series_styles(len(cases))):
        axis.plot(case.steps, [max(r, floor) if r == r else math.nan for r in case.ratios],
                  label=f"{case.name} (baseline {case.status})", markersize=5,
                  lw=2.0 if case.first_diverging_step is not None else 1.0, **style)
        if case.first_diverging_step is not None:
            at = case.steps.index(case.first_diverging_step)
            axis.plot([case.first_diverging_step], [max(case.ratios[at], floor)], marker="X",
                      markersize=12, color=style["color"], linestyle="none", zorder=5)
    axis.set_yscale("log")
    axis.axhline(1.0, color="red", lw=1.2, ls=(0, (4, 2)),
                 label="the baseline threshold (over it: a diverging step, X the first)")
    axis.axhline(floor, color="0.6", lw=0.8, zorder=0)
    ticks = [t for t in axis.get_yticks() if t > floor * 10]
    axis.set_yticks([floor, *ticks])
    axis.set_yticklabels(["exactly 0", *(f"{t:.0e}" for t in ticks)])
    axis.set_ylim(floor / 3, max([*nonzero, 1.0]) * 5)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("step")
    axis.set_ylabel("|loss − baseline| / threshold")
    axis.set_title(f"{model}: each case's loss against the independent baseline, as a share of "
                   "the threshold at that step", fontsize=10)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def _layer_order(entry: dict) -> tuple:
    layer = str(entry.get("layer"))
    name = str(entry.get("name"))
    if layer.isdigit():
        return (1, int(layer), name)
    return (0 if name.startswith(("wte", "wpe")) else 2, 0, name)  # embedding first, head last


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None  # max |got - ref|; None: not finite or not recorded
    stage: str
    bad: bool  # out of tolerance
    nonfinite: bool


def gradient_bars(grads: dict) -> tuple[str, list[Bar]]:
    """What the gradient figure draws: one bar per layer from `per_layer` when the record has
    it, else one per `worst` parameter (older records); (what a bar is, bars)."""
    rows = [r for r in grads.get("per_layer") or [] if isinstance(r, dict)]
    if rows:
        return "layer", [
            Bar(f"layer {r.get('layer')}" if isinstance(r.get("layer"), int)
                else str(r.get("layer")), _finite(r.get("max_abs_diff")), str(r.get("stage")),
                bool(number(r.get("mismatched"))), _finite(r.get("max_abs_diff")) is None
                and number(r.get("max_abs_diff")) is not None)
            for r in rows]
    entries = sorted((e for e in grads.get("worst") or [] if isinstance(e, dict)),
                     key=_layer_order)
    return "parameter", [
        Bar(f"{e.get('name')}\n(layer {e.get('layer')})", _finite(e.get("max_abs_diff")),
            str(e.get("stage")), bool(number(e.get("mismatched"))),
            bool(number(e.get("nonfinite"))))
        for e in entries]


def _finite(value) -> float | None:
    x = number(value)
    return x if x is not None and math.isfinite(x) else None


def gradient_figure(case: CaseView, path: Path) -> Path | None:
    """None when the record holds no per-layer or per-parameter gradient differences."""
    grads = section(case.record, "gradients")
    kind, bars = gradient_bars(grads)
    if not bars:
        return None
    stages = list(dict.fromkeys(b.stage for b in bars))
    colours = {s: series_styles(len(stages))[i]["color"] for i, s in enumerate(stages)}
    fig, axis = plt.subplots(figsize=(max(6, (0.3 if kind == "layer" else 0.5) * len(bars) + 3),
                                      4.5))
    for i, bar in enumerate(bars):
        height = bar.value if bar.value is not None and bar.value > 0 else _TINY
        axis.bar(i, height, color=colours[bar.stage], hatch="//" if bar.nonfinite else None,
                 edgecolor="red" if bar.bad else None, linewidth=1.5 if bar.bad else 0)
    axis.set_yscale("log")
    axis.set_xticks(range(len(bars)))
    axis.set_xticklabels([b.label for b in bars], rotation=60, ha="right", fontsize=7)
    atol = number(section(grads, "tolerance").get("atol"))
    if atol:
        axis.axhline(atol, color="red", ls=":", lw=1, label=f"gradient atol {atol:g}")
    for stage in stages:
        axis.bar(0, 0, color=colours[stage], label=f"stage {stage}")
    axis.bar(0, 0, color="white", edgecolor="red", linewidth=1.5, label="out of tolerance")
    if any(b.nonfinite for b in bars):
        axis.bar(0, 0, color="white", hatch="//", edgecolor="0.3", label="NaN / inf")
    if any(b.value is not None and b.value == 0 for b in bars):
        axis.bar(0, 0, color="white", label=f"exactly 0 (drawn at {_TINY:g})")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.set_ylabel("max |got − ref|")
    what = "every layer" if kind == "layer" else "worst gradients by layer"
    axis.set_title(f"{case.name}: {what}, coloured by stage", fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")  # keeps a legend placed outside the axes
    plt.close(fig)
    return path


# ------------------------------------------------------------------------ the verdict picture
# A picture of the gradient verdict: the scale-free error ||got - ref|| / ||ref|| of every
# compared parameter (the record's `gradients.per_parameter`), one point each, on a log axis.
#
# x: the parameter's place in model order (embedding, layer 0 .. L-1, final norm, lm head), the
# points of one layer spread a little so each shows; the case's pipeline layout is drawn under
# them, one shaded band per chunk labelled with its stage (and virtual chunk when a stage holds
# several), a line at every chunk boundary. Marker and colour: the parameter's kind (ln_* norms,
# attention, MLP, embedding / head). Lines: the verdict's threshold, and the calibrated noise floor
# (`calibration.gradients_noise`) when the record has one. A bug on one stage, one layer or one
# kind of parameter shows as a block, a column or one marker above the threshold.
#
# Drawn for every failing case and for the passing case closest to its threshold in each
# (tag, model) group (`chosen`); `verdict_points` and `stage_bounds` are what the picture holds.

LINK_KEY = "_verdict_plot"  # the record's report-only note of its picture's file name

# kind: (legend label, marker, colour)
KINDS = {
    "ln": ("norm (ln_*)", "o", "tab:orange"),
    "attn": ("attention", "^", "tab:blue"),
    "mlp": ("MLP", "s", "tab:green"),
    "embedding/head": ("embedding / head", "D", "tab:purple"),
    "other": ("other", "X", "0.35"),
}


@dataclass(frozen=True)
class Point:
    name: str  # as the record has it (InfiniTrain's `transformer.` prefix kept)
    layer_index: int  # x slot: -1 embedding, 0 .. L-1 the layers, L final norm, L+1 head
    stage: int | None  # the (first) pipeline stage holding it; None: the layout does not say
    kind: str  # a KINDS key
    error: float  # ||got - ref|| / ||ref||; inf where the run was not finite
    stages: tuple[int, ...] = ()  # every stage holding it (GPT-2's tied wte: first and last)


@dataclass(frozen=True)
class Bound:
    stage: int
    chunk: int  # the stage's virtual chunk, 0 .. vpp-1, in global order
    start: int  # first layer
    end: int  # one past the last layer


def kind_of(name: str) -> str:
    name = canonical_name(name)
    place = layer_of(name)
    parts = name.split(".")
    if any(p.startswith("ln_") for p in parts):
        return "ln"
    if "attn" in parts:
        return "attn"
    if "mlp" in parts:
        return "mlp"
    if place in ("embedding", "head"):
        return "embedding/head"
    return "other"


def _num_layers(record: dict, places) -> int:
    layout = section(record, "layout")
    n = number(layout.get("num_layers"))
    if n is not None and n >= 0:
        return int(n)
    ends = [int(c[2]) for c in layout.get("chunks") or [] if isinstance(c, list) and len(c) == 3]
    layers = [p for p in places if isinstance(p, int)]
    return max([*ends, *(x + 1 for x in layers)], default=0)


def _error(row: dict) -> float | None:
    error = number(row.get("relative_error"))
    if error is not None and not math.isnan(error):
        return error
    diff, ref = number(row.get("diff_norm")), number(row.get("ref_norm"))
    if diff is None or ref is None:
        return None
    if not (math.isfinite(diff) and math.isfinite(ref)) or math.isnan(diff):
        return math.inf
    return diff / ref if ref else (0.0 if diff == 0 else math.inf)


def verdict_points(record: dict) -> list[Point]:
    """One point per compared parameter, in model order; [] when gradients were not compared
    (or the record predates `per_parameter`)."""
    rows = [r for r in section(record, "gradients").get("per_parameter") or []
            if isinstance(r, dict) and r.get("name")]
    if not rows:
        return []
    locator = Locator.from_layout(record.get("layout"), record.get("model"))
    places = [layer_of(str(r["name"])) for r in rows]
    L = _num_layers(record, places)
    slot = {"embedding": -1, "final_norm": L, "head": L + 1, "other": L + 2}
    points = []
    for row, place in zip(rows, places):
        error = _error(row)
        if error is None:
            continue
        name = str(row["name"])
        stages = locator.stages(name)
        points.append(Point(name, place if isinstance(place, int) else slot[place],
                            stages[0] if stages else None, kind_of(name), error, stages))
    return sorted(points, key=lambda p: (p.layer_index, p.name))


def stage_bounds(record: dict) -> list[Bound]:
    """The layout's chunks in global order, each with its stage and virtual chunk index."""
    seen: dict[int, int] = {}
    bounds = []
    for chunk in section(record, "layout").get("chunks") or []:
        try:
            stage, start, end = (int(x) for x in chunk)
        except (TypeError, ValueError):
            return []
        bounds.append(Bound(stage, seen.get(stage, 0), start, end))
        seen[stage] = seen.get(stage, 0) + 1
    return bounds


def verdict_threshold(record: dict) -> float | None:
    return number(section(section(record, "gradients"), "relative").get("threshold"))


def noise_floor(record: dict) -> float | None:
    """The calibrated noise floor of the scale-free gradient error, when calibrated."""
    value = number(section(record, "calibration").get("gradients_noise"))
    return value if value is not None and math.isfinite(value) and value > 0 else None


def closeness(record: dict, points: list[Point] | None = None) -> float:
    """How near the case came to failing: worst error / threshold (worst error without one)."""
    points = verdict_points(record) if points is None else points
    worst = max((p.error for p in points), default=0.0)
    limit = verdict_threshold(record)
    return worst / limit if limit else worst


def chosen(records: list[dict]) -> list[dict]:
    """The records the verdict picture is drawn for, in their order: every failed or errored
    one with compared gradients, and per (tag, model) the passing one closest to its threshold."""
    closest: dict[tuple, tuple[float, int]] = {}  # group: (closeness, index); ties: first
    picked = set()
    for i, record in enumerate(records):
        points = verdict_points(record)
        if not points:
            continue
        status = record.get("status")
        if status in ("failed", "error"):
            picked.add(i)
        elif status == "passed":
            group = (str(record.get("tag")), str(record.get("model")))
            near = closeness(record, points)
            if group not in closest or near > closest[group][0]:
                closest[group] = (near, i)
    picked |= {i for _, i in closest.values()}
    return [r for i, r in enumerate(records) if i in picked]


def verdict_link(record: dict) -> str | None:
    """The file name of the record's picture, once `draw` wrote it."""
    link = record.get(LINK_KEY)
    return link if isinstance(link, str) else None


def verdict_file_name(stem: str, name: str) -> str:
    return f"{stem}-verdict-{slug(name)}.png"


def draw_verdicts(records: list[dict], folder: Path, stem: str) -> dict[str, Path]:
    """Write the pictures of the `chosen` records into `folder`; each record notes its file's
    name (`verdict_link`) for the markdown. {case name: path}."""
    written = {}
    for record in chosen(records):
        path = Path(folder) / verdict_file_name(stem, str(record.get("name")))
        if verdict_figure(record, path):
            record[LINK_KEY] = path.name
            written[str(record.get("name"))] = path
    return written


def _verdict_x(points: list[Point]) -> list[float]:
    """Each point's x: its slot, the slot's parameters spread evenly over 0.7 of its width."""
    by_slot: dict[int, list[int]] = {}
    for i, p in enumerate(points):
        by_slot.setdefault(p.layer_index, []).append(i)
    xs = [0.0] * len(points)
    for slot, members in by_slot.items():
        n = len(members)
        for j, i in enumerate(members):
            xs[i] = slot + ((j - (n - 1) / 2) * 0.7 / n if n > 1 else 0.0)
    return xs


def _slot_label(slot: int, L: int) -> str:
    if slot == -1:
        return "embedding"
    if slot < L:
        return str(slot)
    return {L: "final norm", L + 1: "lm head"}.get(slot, "other")


def verdict_figure(record: dict, path: Path) -> Path | None:
    """None (nothing written) when the record has no compared gradients."""
    points = verdict_points(record)
    if not points:
        return None
    bounds = stage_bounds(record)
    limit, noise = verdict_threshold(record), noise_floor(record)
    finite = [p.error for p in points if math.isfinite(p.error)]
    nonzero = [e for e in finite if e > 0]
    lines = [v for v in (limit, noise) if v]
    floor = min([*nonzero, *lines]) / 100 if nonzero or lines else 1e-12
    top = max([*nonzero, *lines, floor * 100])
    inf_row = top * 100

    def y(error: float) -> float:
        return inf_row if not math.isfinite(error) else max(error, floor)

    slots = sorted({p.layer_index for p in points})
    L = _num_layers(record, [p.layer_index for p in points if 0 <= p.layer_index])
    lo, hi = min(slots[0], -1), max(slots[-1], L)
    fig, axis = plt.subplots(figsize=(min(24, max(8, 0.42 * (hi - lo + 1) + 4)), 5))
    top_text = blended_transform_factory(axis.transData, axis.transAxes)
    stages = sorted({b.stage for b in bounds})
    shade = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(stages)}
    several = any(b.chunk > 0 for b in bounds)
    for k, b in enumerate(bounds):
        left = b.start - 0.5 if k else lo - 0.5  # the first chunk's stage holds the embedding
        right = b.end - 0.5 if k < len(bounds) - 1 else hi + 0.5  # the last's the final norm
        axis.axvspan(left, right, color=shade[b.stage], alpha=0.10, lw=0, zorder=0)
        if k:
            changes = b.stage != bounds[k - 1].stage
            axis.axvline(b.start - 0.5, color="0.25", lw=1.2 if changes else 0.6,
                         ls="-" if changes else ":", zorder=1)
        label = f"stage {b.stage}" + (f"\nchunk {b.chunk}" if several else "")
        axis.text((max(left, b.start - 0.5) + min(right, b.end - 0.5)) / 2, 1.01, label,
                  transform=top_text, ha="center", va="bottom", fontsize=8, color="0.2",
                  clip_on=False)
    xs = _verdict_x(points)
    over = [p for p in points if limit is not None and not p.error <= limit]
    for kind, (label, marker, colour) in KINDS.items():
        mine = [(x, p) for x, p in zip(xs, points) if p.kind == kind]
        if mine:
            axis.scatter([x for x, _ in mine], [y(p.error) for _, p in mine], marker=marker,
                         s=30, color=colour, edgecolors="black", linewidths=0.3, zorder=3,
                         label=label)
    if over:
        axis.scatter([x for x, p in zip(xs, points) if p in over], [y(p.error) for p in over],
                     s=120, facecolors="none", edgecolors="red", linewidths=1.2, zorder=4,
                     label=f"over the threshold ({len(over)})")
        if len(over) <= 8:
            for x, p in zip(xs, points):
                if p in over:
                    axis.annotate(canonical_name(p.name), (x, y(p.error)), fontsize=6,
                                  xytext=(4, 4), textcoords="offset points", color="darkred")
    axis.set_yscale("log")
    if limit:
        axis.axhline(limit, color="red", ls="--", lw=1.3, zorder=2,
                     label=f"threshold {limit:g}")
    if noise:
        axis.axhline(noise, color="0.3", ls=(0, (6, 3)), lw=1.1, zorder=2,
                     label=f"calibrated noise floor {noise:g}")
    rows = {floor: "exactly 0"} if any(e == 0 for e in finite) else {}
    if any(not math.isfinite(p.error) for p in points):
        rows[inf_row] = "inf / NaN"
    axis.set_ylim(floor / 3 if floor in rows else floor, (inf_row if inf_row in rows else top) * 3)
    if rows:
        ticks = [t for t in axis.get_yticks() if floor * 10 < t < top * 10]
        axis.set_yticks(sorted([*rows, *ticks]))
        axis.set_yticklabels([rows.get(t, f"{t:.0e}") for t in sorted([*rows, *ticks])])
        for row in rows:
            axis.axhline(row, color="0.7", lw=0.6, zorder=1)
    axis.set_xlim(lo - 0.5, hi + 0.5)
    axis.set_xticks(range(lo, hi + 1))
    axis.set_xticklabels([_slot_label(s, L) for s in range(lo, hi + 1)],
                         rotation=45 if hi - lo > 6 else 0, ha="right" if hi - lo > 6 else "center",
                         fontsize=7)
    axis.set_xlabel("layer, in model order (shaded: the pipeline chunk holding it)")
    axis.set_ylabel("‖got − ref‖ / ‖ref‖ per parameter (log10)")
    rel = section(section(record, "gradients"), "relative")
    worst = max(points, key=lambda p: (p.error, p.name))
    margin = f", {g(limit / worst.error)}× below the threshold" if (
        limit and worst.error and limit / worst.error >= 1) else ""
    axis.set_title(f"{record.get('name')} ({record.get('status')}): scale-free gradient error, "
                   f"{len(points)} parameters\nworst {g(worst.error)} at "
                   f"{canonical_name(worst.name)}{margin}"
                   + ("" if rel else " (no threshold recorded)"), fontsize=9,
                   pad=28 if several else 16)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, Path(path))
