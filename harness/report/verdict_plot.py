"""A picture of the gradient verdict: the scale-free error ||got - ref|| / ||ref|| of every
compared parameter (the record's `gradients.per_parameter`), one point each, on a log axis.

x: the parameter's place in model order (embedding, layer 0 .. L-1, final norm, lm head), the
points of one layer spread a little so each shows; the case's pipeline layout is drawn under
them, one shaded band per chunk labelled with its stage (and virtual chunk when a stage holds
several), a line at every chunk boundary. Marker and colour: the parameter's kind (ln_* norms,
attention, MLP, embedding / head). Lines: the verdict's threshold, and the calibrated noise floor
(`calibration.gradients_noise`) when the record has one. A bug on one stage, one layer or one
kind of parameter shows as a block, a column or one marker above the threshold.

Drawn for every failing case and for the passing case closest to its threshold in each
(tag, model) group (`chosen`); `verdict_points` and `stage_bounds` are what the picture holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from harness.compare.locate import Locator, canonical_name, layer_of  # noqa: E402

from .values import g, number, section  # noqa: E402

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


def threshold(record: dict) -> float | None:
    return number(section(section(record, "gradients"), "relative").get("threshold"))


def noise_floor(record: dict) -> float | None:
    """The calibrated noise floor of the scale-free gradient error, when calibrated."""
    value = number(section(record, "calibration").get("gradients_noise"))
    return value if value is not None and math.isfinite(value) and value > 0 else None


def closeness(record: dict, points: list[Point] | None = None) -> float:
    """How near the case came to failing: worst error / threshold (worst error without one)."""
    points = verdict_points(record) if points is None else points
    worst = max((p.error for p in points), default=0.0)
    limit = threshold(record)
    return worst / limit if limit else worst


def chosen(records: list[dict]) -> list[dict]:
    """The records pictured, in their order: every failed or errored one with compared
    gradients, and per (tag, model) the passing one closest to its threshold."""
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


def link_of(record: dict) -> str | None:
    """The file name of the record's picture, once `draw` wrote it."""
    link = record.get(LINK_KEY)
    return link if isinstance(link, str) else None


def file_name(stem: str, name: str) -> str:
    from .plots import slug

    return f"{stem}-verdict-{slug(name)}.png"


def draw(records: list[dict], folder: Path, stem: str) -> dict[str, Path]:
    """Write the pictures of the `chosen` records into `folder`; each record notes its file's
    name (`link_of`) for the markdown. {case name: path}."""
    written = {}
    for record in chosen(records):
        path = Path(folder) / file_name(stem, str(record.get("name")))
        if verdict_figure(record, path):
            record[LINK_KEY] = path.name
            written[str(record.get("name"))] = path
    return written


def _x(points: list[Point]) -> list[float]:
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
    limit, noise = threshold(record), noise_floor(record)
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
        axis.text((max(left, b.start - 0.5) + min(right, b.end - 0.5)) / 2, 0.985, label,
                  transform=top_text, ha="center", va="top", fontsize=8, color="0.2")
    xs = _x(points)
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
                   + ("" if rel else " (no threshold recorded)"), fontsize=9)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, Path(path))


def _save(fig, path: Path) -> Path:
    from .plots import _save as save

    return save(fig, path)


__all__ = ["Bound", "KINDS", "Point", "chosen", "draw", "link_of", "stage_bounds",
           "verdict_figure", "verdict_points"]
