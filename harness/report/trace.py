"""A case's module-level trace (issue 46), as the report shows it: the record's `trace` (the
step traced against the single-device reference) and `baseline.trace` (step 1 against the
PyTorch baseline), same shape (docs: the result record's `trace` field).

Data only, no matplotlib (harness.report.trace_plot draws): `trace_points` is what the picture
holds, one point per compared module output (forward) or output gradient (backward) at its
place in execution order, with its error over its threshold; `trace_marks` the first diverging
and last matched points; `trace_lines` the markdown of one case's traces (the picture's link
once drawn, its line as caption, cost and unpaired counts; a skipped or failed trace's reason).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.results.values import g, md_escape, number, section

LINK_KEY = "_trace_plots"  # the record's report-only note: {trace key: its picture's file name}

# (key, where in the record, what the partner is called when the trace does not say)
TRACE_KEYS = (("trace", ("trace",), "reference"),
              ("baseline", ("baseline", "trace"), "pytorch baseline"))

_LAYER = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks)\.(\d+)(?:\.|$)")
_PREFIX = re.compile(r"^(?:transformer|model)\.")


@dataclass(frozen=True)
class TracePoint:
    x: int  # the entry's `order`: its place in execution order (the forward pass first)
    module: str  # as the record names it
    phase: str  # "forward" | "backward"
    index: int  # the (module, phase) call's index in the step (0 for most)
    rank: int | None
    ratio: float  # max |d| / threshold; NaN when the entry is NaN / inf (or its ratio is)
    ok: bool  # within the threshold (as the record says; ratio <= 1 when it does not)
    nan: bool  # a NaN or inf in the run or the partner (or a non-finite ratio)
    layer: int | None  # the block's index (`h.3` -> 3); None: embedding, head, containers
    note: str | None = None

    @property
    def label(self) -> str:
        """`h.3 attn.c_attn forward (rank 1)`: the module's place for a reader."""
        index = f" #{self.index}" if self.index else ""
        rank = f" (rank {self.rank})" if self.rank else ""
        return f"{short_name(self.module)} {self.phase}{index}{rank}"


def short_name(module: str) -> str:
    """`transformer.h.3.attn.c_attn` -> `h.3 attn.c_attn`; `h.3` -> `h.3`; others lose only
    InfiniTrain's `transformer.` prefix (`wte`, `lm_head`, `CrossEntropyLoss`)."""
    name = _PREFIX.sub("", str(module))
    found = _LAYER.search(name)
    if not found:
        return name
    head = name[:found.end()].rstrip(".")
    rest = name[found.end():]
    return f"{head} {rest}" if rest else head


def layer_index(module: str) -> int | None:
    found = _LAYER.search(str(module))
    return int(found.group(1)) if found else None


def traces_of(record: dict) -> list[tuple[str, dict]]:
    """The record's traces as (key, trace): "trace" then "baseline", those that are present."""
    found = []
    for key, where, _ in TRACE_KEYS:
        value = record
        for part in where:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, dict):
            found.append((key, value))
    return found


def partner_of(key: str, trace: dict) -> str:
    return str(trace.get("partner") or dict((k, p) for k, _, p in TRACE_KEYS)[key])


def _entry_point(entry: dict, position: int) -> TracePoint:
    order = number(entry.get("order"))
    ratio = number(entry.get("ratio"))
    max_abs, threshold = number(entry.get("max_abs")), number(entry.get("threshold"))
    if ratio is None and max_abs is not None and threshold:
        ratio = max_abs / threshold
    nan = bool(number(entry.get("nan"))) or (ratio is not None and not math.isfinite(ratio)) \
        or (max_abs is not None and not math.isfinite(max_abs))
    if nan or ratio is None:
        ratio = math.nan
    ok = entry.get("ok") if isinstance(entry.get("ok"), bool) else (not nan and ratio <= 1)
    rank = number(entry.get("rank"))
    return TracePoint(
        x=int(order) if order is not None and math.isfinite(order) else position,
        module=str(entry.get("module")), phase=str(entry.get("phase") or "forward"),
        index=int(number(entry.get("index")) or 0),
        rank=int(rank) if rank is not None and math.isfinite(rank) else None,
        ratio=ratio, ok=bool(ok) and not nan, nan=nan,
        layer=layer_index(str(entry.get("module"))),
        note=str(entry["note"]) if entry.get("note") else None)


def trace_points(trace: dict) -> list[TracePoint]:
    """One point per compared pair of `trace["modules"]`, in execution order (by `order`; an
    entry without one keeps its place in the list); [] when the trace compared nothing."""
    entries = [e for e in trace.get("modules") or [] if isinstance(e, dict)]
    points = [_entry_point(e, k) for k, e in enumerate(entries)]
    return sorted(points, key=lambda p: (p.x, p.rank if p.rank is not None else -1))


def _same(point: TracePoint, entry: dict) -> bool:
    rank = number(entry.get("rank"))
    order = number(entry.get("order"))
    return (point.module == str(entry.get("module"))
            and point.phase == str(entry.get("phase") or "forward")
            and point.index == int(number(entry.get("index")) or 0)
            and (rank is None or point.rank == int(rank))
            and (order is None or point.x == int(order)))


def find_entry(points: list[TracePoint], entry) -> TracePoint | None:
    """The point of a trace's `first_diverging` / `last_matched` entry; when `modules` does
    not hold it (a record cut short), a point of its own; None when there is no entry."""
    if not isinstance(entry, dict):
        return None
    for point in points:
        if _same(point, entry):
            return point
    return _entry_point(entry, len(points))


def trace_marks(trace: dict, points: list[TracePoint] | None = None
                ) -> tuple[TracePoint | None, TracePoint | None]:
    """(the first diverging point, the last matched point), as the trace names them."""
    points = trace_points(trace) if points is None else points
    return find_entry(points, trace.get("first_diverging")), \
        find_entry(points, trace.get("last_matched"))


def phase_split(points: list[TracePoint]) -> float | None:
    """The x between the forward pass and the backward pass (where the picture's separator
    goes); None when the trace holds only one of them."""
    forward = [p.x for p in points if p.phase == "forward"]
    backward = [p.x for p in points if p.phase == "backward"]
    if not forward or not backward:
        return None
    return (max(forward) + min(backward)) / 2 if max(forward) < min(backward) else \
        min(backward) - 0.5


def block_ticks(points: list[TracePoint]) -> list[tuple[int, str]]:
    """Where a reader finds each block: (x, label) at the first entry of every layer in each
    pass (`h.3`), and at the first of the entries before the first layer and after the last
    one (`wte …`, `CrossEntropyLoss …`), per pass. Legible at ~180 entries (GPT-2 of 8
    layers: 20 labels), where one label per entry is not."""
    ticks: list[tuple[int, str]] = []
    for phase in ("forward", "backward"):
        mine = [p for p in points if p.phase == phase]
        if not mine:
            continue
        layered = [k for k, p in enumerate(mine) if p.layer is not None]
        seen: set[int] = set()
        for k, p in enumerate(mine):
            if p.layer is not None and p.layer not in seen:
                seen.add(p.layer)
                ticks.append((p.x, short_name(p.module).split(" ")[0]))
        first, last = (layered[0], layered[-1]) if layered else (len(mine), len(mine))
        for run in (mine[:first], mine[last + 1:]):
            names = list(dict.fromkeys(short_name(p.module) for p in run))
            if names:
                head = names[0] if len(names[0]) <= 16 else names[0][:15] + "…"
                more = len(names) > 1 and not head.endswith("…")
                ticks.append((run[0].x, head + (" …" if more else "")))
    return sorted(set(ticks))


# ------------------------------------------------------------------------------ markdown

NOTE = ("Module trace pictures: each compared module's max |run − partner| over its threshold "
        "(log scale) in execution order, the forward pass (module outputs) then the backward "
        "pass (gradients of the outputs); red dashed: the threshold (ratio 1); ★ the first "
        "diverging module, ◯ the last that matched; ✕ on the top row: NaN / inf; the bottom "
        "row: exactly 0.")


def trace_link(record: dict, key: str) -> str | None:
    """The file name of the picture of the record's trace `key`, once drawn."""
    links = record.get(LINK_KEY)
    link = links.get(key) if isinstance(links, dict) else None
    return link if isinstance(link, str) else None


def _size(n) -> str:
    x = number(n)
    if x is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{int(x)} B"


def cost_line(trace: dict) -> str:
    """"178 pairs compared; cost 0.23 s, peak 12.0 MB (356 tensors, 48.1 MB read); unpaired:
    2 of the run's, 0 of the partner's"."""
    cost = section(trace, "cost")
    unpaired = section(trace, "unpaired")
    run, partner = (len(unpaired.get(k) or []) for k in ("run", "partner"))
    seconds = number(cost.get("seconds"))
    parts = [f"cost {g(seconds)} s" if seconds is not None else "cost not recorded"]
    if cost.get("peak_bytes") is not None:
        parts.append(f"peak {_size(cost.get('peak_bytes'))}")
    read = [f"{int(number(cost['tensors']))} tensors" if number(cost.get("tensors")) else None,
            f"{_size(cost['bytes_read'])} read" if number(cost.get("bytes_read")) else None]
    read = [r for r in read if r]
    compared = len([e for e in trace.get("modules") or [] if isinstance(e, dict)])
    return (f"{compared} pairs compared; {', '.join(parts)}"
            + (f" ({', '.join(read)})" if read else "")
            + f"; unpaired: {run} of the run's, {partner} of the partner's")


def _title(key: str, trace: dict) -> str:
    step = trace.get("step")
    at = f" of step {step}" if step is not None else ""
    return f"**Module trace{at}** against the {partner_of(key, trace)}"


def trace_lines(record: dict, name: str) -> list[str]:
    """The markdown of the record's traces: per trace its picture (when drawn), its line as
    the caption, the cost and unpaired counts, the unpaired names folded; a skipped or failed
    trace: one line with its reason. [] when the record has no trace."""
    lines: list[str] = []
    for key, trace in traces_of(record):
        status = str(trace.get("status") or "not recorded")
        if status in ("skipped", "error"):
            reason = trace.get("reason") or "no reason recorded"
            lines += [f"- {_title(key, trace)}: {status}: {md_escape(reason)}", ""]
            continue
        lines += [f"{_title(key, trace)}: {status}", ""]
        link = trace_link(record, key)
        if link:
            lines += [f"![module trace of {name} against the {partner_of(key, trace)}: each "
                      f"module's error over its threshold in execution order]({link})", ""]
        caption = trace.get("line") or (
            "every compared module matched" if status == "matched" else None)
        if caption:
            lines += [f"*{md_escape(caption)}*", ""]
        lines += [f"- {cost_line(trace)}", ""]
        lines += blame_lines(trace)
        unpaired = section(trace, "unpaired")
        names = [(side, str(n)) for side in ("run", "partner") for n in unpaired.get(side) or []]
        if names:
            lines += [f"<details><summary>unpaired ({len(names)})</summary>", "",
                      *(f"- {side}: `{md_escape(n)}`" for side, n in names), "", "</details>",
                      ""]
    return lines


def blame_lines(trace: dict) -> list[str]:
    """The trace's replay (harness.runner.replay, `trace.blame`): its verdict line, the calls
    over their floors (local error over floor), or why it was not replayed."""
    blame = trace.get("blame")
    if not isinstance(blame, dict):
        return []
    title = "**Each module on the subject's own inputs** (the replay)"
    if blame.get("status") in ("skipped", "error"):
        return [f"- {title}: {blame.get('status')}: "
                f"{md_escape(str(blame.get('reason') or 'no reason recorded'))}", ""]
    lines = [f"- {title}: {md_escape(str(blame.get('line') or blame.get('status')))}"]
    over = blame.get("over") or []
    if len(over) > 1:
        lines += [f"  - {md_escape(str(o.get('line')))}" for o in over[1:5]]
        if len(over) > 5:
            lines.append(f"  - and {len(over) - 5} more over their floors")
    return lines + [""]


def traced_elsewhere(records: list[dict], shown: set[str]) -> list[str]:
    """"## Module traces": the traces of the cases whose section (Failures) did not show them,
    a passing case traced under `all`; [] when there are none."""
    lines = []
    for record in records:
        name = str(record.get("name"))
        if name in shown or not traces_of(record):
            continue
        lines += [f"### `{name}`: {record.get('status')}", "", *trace_lines(record, name)]
    return (["## Module traces", "", NOTE, "", *lines]) if lines else []
