"""PNG figures beside the markdown (matplotlib, Agg: CI has no display).

- loss per model: the reference curve, and each case's |loss - reference| per step on a log
  scale against the loss tolerance, so a drift shows before it crosses the line;
- gradient error of a failed case: each recorded parameter's max |got - ref|, ordered by layer,
  coloured by pipeline stage, against the gradient tolerance.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .summary import CaseView  # noqa: E402
from .values import number, section  # noqa: E402

_TINY = 1e-12  # a log axis cannot show an exact 0 difference


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def _series(values) -> list[float | None]:
    return [number(v) for v in values] if isinstance(values, list) else []


def loss_figure(model: str, cases: list[CaseView], path: Path) -> Path | None:
    """None when no case of the model recorded both its losses and its reference's."""
    plotted = [(c, _series(c.record.get("losses")), _series(c.record.get("reference_losses")))
               for c in cases]
    plotted = [(c, got, ref) for c, got, ref in plotted if got and ref]
    if not plotted:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    reference = max((ref for _, _, ref in plotted), key=len)
    steps = range(1, len(reference) + 1)
    top.plot(steps, [math.nan if v is None else v for v in reference], "k-", lw=2,
             label="single-device reference")
    tolerances = set()
    for case, got, ref in plotted:
        n = min(len(got), len(ref))
        diffs = [abs(got[i] - ref[i]) if got[i] is not None and ref[i] is not None else math.nan
                 for i in range(n)]
        style = "-" if case.status == "passed" else "--"
        bottom.semilogy(range(1, n + 1), [max(d, _TINY) if d == d else math.nan for d in diffs],
                        style, marker=".", label=f"{case.case_id} ({case.status})")
        top.plot(range(1, len(got) + 1), [math.nan if v is None else v for v in got], style,
                 lw=0.8, alpha=0.7)
        atol = number(section(section(case.record, "tolerances"), "loss").get("atol"))
        if atol:
            tolerances.add(atol)
    for atol in sorted(tolerances):
        bottom.axhline(atol, color="red", lw=1, ls=":", label=f"loss atol {atol:g}")
    top.set_ylabel("loss")
    top.set_title(f"{model}: loss per step against the single-device reference")
    top.legend(fontsize=7)
    bottom.set_ylabel(f"|loss - reference| (0 drawn at {_TINY:g})")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("step")
    bottom.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def _layer_order(entry: dict) -> tuple:
    layer = str(entry.get("layer"))
    name = str(entry.get("name"))
    if layer.isdigit():
        return (1, int(layer), name)
    return (0 if name.startswith(("wte", "wpe")) else 2, 0, name)  # embedding first, head last


def gradient_figure(case: CaseView, path: Path) -> Path | None:
    """None when the record holds no per-parameter gradient differences."""
    grads = section(case.record, "gradients")
    entries = [e for e in (grads.get("worst") or []) if isinstance(e, dict)]
    if not entries:
        return None
    entries.sort(key=_layer_order)
    stages = sorted({str(e.get("stage")) for e in entries})
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(stages)}
    fig, axis = plt.subplots(figsize=(max(6, 0.5 * len(entries) + 3), 4.5))
    for i, entry in enumerate(entries):
        value = number(entry.get("max_abs_diff"))
        height = _TINY if value is None or not math.isfinite(value) or value <= 0 else value
        axis.bar(i, height, color=colours[str(entry.get("stage"))],
                 hatch="//" if number(entry.get("nonfinite")) else None)
    axis.set_yscale("log")
    axis.set_xticks(range(len(entries)))
    axis.set_xticklabels([f"{e.get('name')}\n(layer {e.get('layer')})" for e in entries],
                         rotation=60, ha="right", fontsize=7)
    atol = number(section(grads, "tolerance").get("atol"))
    if atol:
        axis.axhline(atol, color="red", ls=":", lw=1, label=f"gradient atol {atol:g}")
    for stage in stages:
        axis.bar(0, 0, color=colours[stage], label=f"stage {stage}")
    axis.legend(fontsize=7)
    axis.set_ylabel("max |got - ref| (hatched: NaN / inf in the run)")
    axis.set_title(f"{case.name}: worst gradients by layer, coloured by stage", fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")  # keeps a legend placed outside the axes
    plt.close(fig)
    return path
