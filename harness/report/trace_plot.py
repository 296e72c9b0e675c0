"""The module trace picture (issue 46): where the numbers of a failed case first part.

One point per compared pair of the trace (harness.report.trace.trace_points): x its place in
execution order (the forward pass's module outputs, a separator, then the backward pass's
output gradients), y its max |run − partner| over its threshold on a log axis, against the
line at 1 (the threshold). The first diverging entry is a red star labelled with its module and
phase, the last matched a green ring labelled likewise; a NaN / inf entry is a black ✕ on the
top row, an exact 0 sits on the bottom row. The x ticks name the blocks (`h.3` at each layer's
first entry in each pass), every entry has a minor tick. Written beside the markdown as
`<stem>-trace-<case>.png` (`<stem>-baseline-trace-<case>.png` for `baseline.trace`), each
record noting its files under harness.report.trace.LINK_KEY, as the verdict pictures do.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a CI runner
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from harness.results.values import g, slug  # noqa: E402

from .trace import (  # noqa: E402
    LINK_KEY,
    TracePoint,
    block_ticks,
    partner_of,
    phase_split,
    trace_marks,
    trace_points,
    traces_of,
)

FIRST_GID = "first-diverging"  # the annotation's gid: tests find the mark by it
LAST_GID = "last-matched"
_RANK_MARKERS = ("o", "s", "^", "D", "v", "P", "<", ">")


def trace_file_name(stem: str, name: str, key: str) -> str:
    return f"{stem}-{'trace' if key == 'trace' else 'baseline-trace'}-{slug(name)}.png"


def rows(points: list[TracePoint]) -> tuple[float, float, float]:
    """(floor, top, nan_row): where an exact 0 is drawn (a log axis has no 0), the highest
    finite ratio (at least the threshold), and the row of the NaN / inf entries above it."""
    finite = [p.ratio for p in points if not p.nan and math.isfinite(p.ratio)]
    nonzero = [r for r in finite if r > 0]
    floor = min([*nonzero, 1.0]) / 100
    top = max([*nonzero, 1.0])
    return floor, top, top * 100


def y_of(point: TracePoint, floor: float, nan_row: float) -> float:
    return nan_row if point.nan else max(point.ratio, floor)


def trace_axes(trace: dict, title: str):
    """The figure of one trace (not saved); None when it compared nothing."""
    points = trace_points(trace)
    if not points:
        return None
    floor, top, nan_row = rows(points)
    first, last = trace_marks(trace, points)
    lo, hi = min(p.x for p in points), max(p.x for p in points)
    fig, axis = plt.subplots(figsize=(min(26, max(9, 0.085 * len(points) + 5)), 5.2))
    above = blended_transform_factory(axis.transData, axis.transAxes)

    split = phase_split(points)
    if split is not None:
        axis.axvspan(split, hi + 0.5, color="tab:purple", alpha=0.06, lw=0, zorder=0)
        axis.axvline(split, color="0.2", lw=1.4, zorder=1)
    for phase, (a, b) in (("forward pass: module outputs →", (lo - 0.5, split)),
                          ("backward pass: gradients of the outputs →", (split, hi + 0.5))):
        mine = [p.x for p in points if phase.startswith(p.phase)]
        if mine:
            a = a if a is not None else lo - 0.5
            b = b if b is not None else hi + 0.5
            axis.text((a + b) / 2, 1.01, phase, transform=above, ha="center", va="bottom",
                      fontsize=8, color="0.2", clip_on=False)
    ticks = block_ticks(points)
    for x, _ in ticks:
        axis.axvline(x - 0.5, color="0.85", lw=0.6, zorder=0)

    ranks = sorted({p.rank for p in points}, key=lambda r: -1 if r is None else r)
    several = len(ranks) > 1
    for k, rank in enumerate(ranks):
        mine = [p for p in points if p.rank == rank]
        marker = _RANK_MARKERS[k % len(_RANK_MARKERS)]
        axis.plot([p.x for p in mine], [math.nan if p.nan else max(p.ratio, floor)
                                         for p in mine],
                  color="0.65", lw=0.6, zorder=2)
        for ok, colour, what in ((True, "tab:blue", "within the threshold"),
                                 (False, "tab:red", "over the threshold")):
            part = [p for p in mine if p.ok == ok and not p.nan]
            if part:
                axis.scatter([p.x for p in part], [y_of(p, floor, nan_row) for p in part],
                             s=16, marker=marker, color=colour, edgecolors="black",
                             linewidths=0.25, zorder=3,
                             label=what + (f" (rank {rank})" if several else ""))
    bad = [p for p in points if p.nan]
    if bad:
        axis.scatter([p.x for p in bad], [nan_row] * len(bad), s=60, marker="X",
                     color="black", zorder=4, label=f"NaN / inf ({len(bad)})")

    axis.set_yscale("log")
    axis.axhline(1.0, color="red", ls="--", lw=1.3, zorder=2,
                 label="the threshold (ratio 1)")
    labels = {}
    if any(not p.nan and p.ratio == 0 for p in points):
        labels[floor] = "exactly 0"
    if bad:
        labels[nan_row] = "NaN / inf"
    axis.set_ylim(floor / 3 if floor in labels else floor,
                  (nan_row if bad else top) * (4 if bad else 30))
    if labels:
        between = [t for t in axis.get_yticks() if floor * 10 < t < top * 10]
        shown = sorted([*labels, *between])
        axis.set_yticks(shown)
        axis.set_yticklabels([labels.get(t, f"{t:.0e}") for t in shown])
        for row in labels:
            axis.axhline(row, color="0.7", lw=0.6, zorder=1)

    span = max(hi - lo, 1)
    for point, gid, colour, text in ((first, FIRST_GID, "darkred", "first diverging"),
                                     (last, LAST_GID, "darkgreen", "last matched")):
        if point is None:
            continue
        y = y_of(point, floor, nan_row)
        if gid == FIRST_GID:
            axis.scatter([point.x], [y], s=260, marker="*", color="red", edgecolors="black",
                         linewidths=0.6, zorder=6, label="first diverging")
        else:
            axis.scatter([point.x], [y], s=150, facecolors="none", edgecolors="green",
                         linewidths=1.6, zorder=6, label="last matched")
        right = (point.x - lo) / span > 0.7
        up = 28 if gid == FIRST_GID else -34
        value = "NaN / inf" if point.nan else f"ratio {g(point.ratio)}"
        if point.note:
            value += f" ({point.note[:60]})"
        axis.annotate(f"{text}: {point.label}\n{value}", (point.x, y),
                      xytext=(-12 if right else 12, up), textcoords="offset points",
                      ha="right" if right else "left", va="center", fontsize=7.5,
                      color=colour, gid=gid, annotation_clip=False,
                      bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": colour,
                            "lw": 0.6, "alpha": 0.9},
                      arrowprops={"arrowstyle": "->", "color": colour, "lw": 0.8})

    axis.set_xlim(lo - 0.5, hi + 0.5)
    axis.set_xticks([x for x, _ in ticks])
    axis.set_xticklabels([label for _, label in ticks], rotation=90, fontsize=7)
    axis.set_xticks(sorted({p.x for p in points}), minor=True)
    axis.tick_params(axis="x", which="minor", length=2, color="0.6")
    axis.set_xlabel("module, in execution order (a label at each block's first entry; one "
                    "minor tick per compared tensor)", fontsize=8)
    axis.set_ylabel("max |run − partner| / threshold (log)")
    axis.set_title(title, fontsize=9, pad=18)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _title(name: str, key: str, trace: dict) -> str:
    points = [p for p in trace_points(trace)]
    over = sum(1 for p in points if not p.ok)
    step = trace.get("step")
    return (f"{name}: module trace{f' of step {step}' if step is not None else ''} against "
            f"the {partner_of(key, trace)} ({trace.get('status')}): {len(points)} pairs, "
            f"{over} over the threshold")


def trace_figure(trace: dict, path: Path, title: str) -> Path | None:
    """Write the picture of `trace` to `path`; None (nothing written) when it compared
    nothing."""
    fig = trace_axes(trace, title)
    if fig is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def draw_traces(records: list[dict], folder: Path, stem: str) -> dict[str, Path]:
    """Write the picture of every trace with compared modules (the record's `trace` and its
    `baseline.trace`) into `folder`; each record notes its files' names under LINK_KEY for the
    markdown (harness.report.trace.trace_link). {file name: path}."""
    written = {}
    for record in records:
        name = str(record.get("name"))
        for key, trace in traces_of(record):
            if trace.get("status") in ("skipped", "error"):
                continue  # its reason is a line of the markdown, no picture
            path = Path(folder) / trace_file_name(stem, name, key)
            if trace_figure(trace, path, _title(name, key, trace)):
                links = record.get(LINK_KEY) if isinstance(record.get(LINK_KEY), dict) else {}
                record[LINK_KEY] = {**links, key: path.name}
                written[path.name] = path
    return written
