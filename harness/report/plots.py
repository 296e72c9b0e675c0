"""PNG figures beside the markdown (matplotlib, Agg: CI has no display).

- loss per model: the reference curve, and each case's |loss - reference| per step on a log
  scale against the loss tolerance, so a drift shows before it crosses the line;
- the verdict picture (harness.report.verdict_plot): every parameter's scale-free gradient error
  by layer, over the case's pipeline stages, against the threshold and the noise floor; for
  each failing case and the closest passing case of each (tag, model), written beside the loss
  figure of their model (`loss_figure` is the report's one call per model);
- gradient error of a failed case: max |got - ref| per layer (the record's `per_layer`
  summary: every layer, embedding and head included), or, in records without it, per recorded
  worst parameter; ordered by layer, coloured by pipeline stage, against the gradient tolerance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from . import verdict_plot  # noqa: E402
from .case_view import CaseView  # noqa: E402
from .steps import reference_steps, run_steps  # noqa: E402
from .values import number, section  # noqa: E402

_TINY = 1e-12  # a log axis cannot show an exact 0 difference


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def _series(values) -> list[float | None]:
    return [number(v) for v in values] if isinstance(values, list) else []


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")
_LINES = ("-", "--", "-.", ":")


def series_styles(n: int) -> list[dict]:
    """n distinct (colour, marker, line style) combinations: 20 colours (tab20, the dark shade
    of each hue first), each with its own marker; past 20 the line style changes too."""
    cmap = plt.get_cmap("tab20")
    order = [*range(0, 20, 2), *range(1, 20, 2)]  # 10 dark hues, then their light shades
    return [{"color": cmap(order[i % 20]), "marker": _MARKERS[i % len(_MARKERS)],
             "linestyle": _LINES[(i // 20) % len(_LINES)]} for i in range(n)]


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
    verdict_pictures(model, cases, path)
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


def verdict_pictures(model: str, cases: list[CaseView], path: Path) -> dict[str, Path]:
    """The verdict pictures of the model's cases, beside the report's loss figure `path`
    ({stem}-loss-{model}.png, as the report names it): {stem}-verdict-{case}.png; each case's
    record notes its picture for the markdown (verdict_plot.link_of). {} for another path."""
    suffix = f"-loss-{slug(model)}.png"
    if not path.name.endswith(suffix):
        return {}
    stem = path.name[:-len(suffix)]
    return verdict_plot.draw([c.record for c in cases if c.model == model], path.parent, stem)


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
