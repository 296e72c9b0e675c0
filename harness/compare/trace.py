"""Two module-level traces of one step compared tensor by tensor, in execution order: where the
numbers first part.

A trace (harness.contracts.trace) holds every module's forward output and the gradient of
that output, per rank. The partner (the single-device reference, or the PyTorch baseline) is
walked in its execution order: every rank's forward pass in rank order, then the backward
passes in reverse rank order (a pipeline's order for one microbatch). Each partner tensor is
paired with the run's tensors of the same module and phase (the run's names mapped through
`Naming`: a pipeline stage's local layer index made global, a foreign program's names made the
bundled trainer's) and compared:

- equal shapes: the same call (index) of the module, whole;
- a smaller tensor: a slice of the partner's (a TP rank's column-parallel output, a pipeline
  microbatch, a data-parallel rank's batch), found as gradient shards are
  (harness.compare.tp_shards.match_shard: the slice that fits it best; the record says which).
  Where the partner calls the module more than once (a step's microbatches), a call's slices
  are the run's pieces of the same call (a TP rank's output of microbatch 1 is no slice of
  microbatch 0's), unless the run has none of that call.

A pair passes when max |run - partner| <= atol + rtol * max |partner| (TraceThresholds). The
first pair that does not is the first diverging module; the last that passed before it is the
last that matched. A NaN or Inf where the partner has a finite value is a divergence, never a
crash; a tensor whose shape no slicing explains is one too, naming both shapes. Whatever cannot
be paired is listed by name with the reason, never dropped. Plain numpy, no torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.contracts.trace import (PHASES, Pairing, Trace, TraceEntry, TraceError,
                                     find_trace_root, globalize_layer, read_trace, trace_ranks)

from .dumps import folder_bytes
from .tp_shards import match_shard

TRACE_STATUSES = ("matched", "diverged", "skipped", "error")


@dataclass(frozen=True)
class TraceThresholds:
    """A pair passes when max |d| <= atol + rtol * max |partner|. `source` says where the
    numbers come from (the measurement that chose them)."""
    atol: float
    rtol: float
    source: str

    def __post_init__(self) -> None:
        for name, value in (("atol", self.atol), ("rtol", self.rtol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"trace threshold {name} is {value!r}; expected a finite "
                                 f"number >= 0")

    def bound(self, max_ref: float) -> float:
        return self.atol + self.rtol * max_ref

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "source": self.source}


@dataclass(frozen=True)
class Naming:
    """How a run's module names become its partner's: `stage_layers` gives a rank's stage's
    global layers where the trainer numbers them from 0 on each stage (InfiniTrain), and
    `pairing` a foreign program's names in the bundled trainer's (None: the same trainer)."""
    pairing: Pairing | None = None
    stage_layers: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def partner_name(self, module: str, rank: int) -> str | None:
        layers = self.stage_layers.get(rank)
        name = globalize_layer(module, layers) if layers else module
        return self.pairing.bundled_name(name) if self.pairing is not None else name

    def why_unpaired(self, module: str) -> str | None:
        return self.pairing.why_unpaired(module, "subject") if self.pairing is not None \
            else None

    def flat_view(self, partner_module: str, shape: tuple, partner_shape: tuple) -> bool:
        """Whether the run's tensor is the partner's seen as (rows, last dim), as the pairing
        facts say the program writes that module's (qwen3's q / k norms)."""
        return self.pairing is not None and self.pairing.as_bundled_shape(
            partner_module, tuple(shape), tuple(partner_shape))


@dataclass(frozen=True)
class ModuleDiff:
    """One partner tensor against the run's: the worst of the run's tensors paired with it."""
    module: str  # the partner's name
    phase: str
    index: int
    rank: int | None  # the run's rank of the worst tensor
    order: int  # position in the walk
    shape: tuple[int, ...]  # the partner's
    max_abs: float  # inf: a NaN / Inf or a shape no slice explains
    max_ref: float
    threshold: float
    ok: bool
    pieces: int  # run tensors compared with it
    note: str | None = None  # a slice, a NaN, a shape

    @property
    def label(self) -> str:
        return f"{self.module} {self.phase}" + (f"#{self.index}" if self.index else "")

    @property
    def ratio(self) -> float:
        if self.threshold > 0:
            return self.max_abs / self.threshold
        return 0.0 if self.max_abs == 0 else math.inf

    def to_dict(self) -> dict:
        return {"module": self.module, "phase": self.phase, "index": self.index,
                "rank": self.rank, "order": self.order, "shape": list(self.shape),
                "max_abs": _json(self.max_abs), "max_ref": _json(self.max_ref),
                "threshold": self.threshold, "ratio": _json(self.ratio), "ok": self.ok,
                "pieces": self.pieces, "note": self.note}


def _json(value: float):
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan")


@dataclass(frozen=True)
class TraceDiff:
    step: int
    partner: str  # "reference" | "pytorch baseline"
    modules: tuple[ModuleDiff, ...]
    unpaired_run: tuple[str, ...]  # "<label> (rank r): why"
    unpaired_partner: tuple[str, ...]
    thresholds: TraceThresholds
    cost: dict

    @property
    def first_diverging(self) -> ModuleDiff | None:
        return next((m for m in self.modules if not m.ok), None)

    @property
    def last_matched(self) -> ModuleDiff | None:
        first = self.first_diverging
        before = self.modules if first is None else self.modules[: first.order]
        return next((m for m in reversed(before) if m.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_diverging is None

    @property
    def status(self) -> str:
        return "matched" if self.ok else "diverged"

    def line(self) -> str:
        """`first diverging: h.3.attn forward (rank 1): max |d| 2.1e-3 > 1e-5; last that
        matched: h.3.ln_1 forward, 4e-8` (or that every pair matched)."""
        first, last = self.first_diverging, self.last_matched
        if first is None:
            return (f"every module matched at step {self.step} ({len(self.modules)} tensors "
                    f"against the {self.partner}; worst {_worst(self.modules)})")
        where = f" (rank {first.rank})" if first.rank is not None else ""
        text = (f"first diverging: {first.label}{where}: max |d| {first.max_abs:.2g} > "
                f"{first.threshold:.2g}" + (f", {first.note}" if first.note else ""))
        text += (f"; last that matched: {last.label}, {last.max_abs:.2g}" if last is not None
                 else "; none matched before it")
        return text

    def to_dict(self) -> dict:
        first, last = self.first_diverging, self.last_matched
        return {"status": self.status, "reason": None, "step": self.step,
                "partner": self.partner, "line": self.line(),
                "first_diverging": first.to_dict() if first else None,
                "last_matched": last.to_dict() if last else None,
                "modules": [m.to_dict() for m in self.modules],
                "unpaired": {"run": list(self.unpaired_run),
                             "partner": list(self.unpaired_partner)},
                "thresholds": self.thresholds.to_dict(), "cost": dict(self.cost)}


def _worst(modules) -> str:
    if not modules:
        return "none compared"
    worst = max(modules, key=lambda m: m.ratio)
    return f"{worst.label} at {worst.ratio:.2g} of its threshold"


def not_traced(status: str, reason: str, step: int | None, partner: str) -> dict:
    """The record's `trace` for a trace not taken (skipped) or not readable (error)."""
    if status not in ("skipped", "error"):
        raise ValueError(f"trace status {status!r}; expected skipped or error here")
    return {"status": status, "reason": reason, "step": step, "partner": partner,
            "line": None, "first_diverging": None, "last_matched": None, "modules": [],
            "unpaired": {"run": [], "partner": []}, "thresholds": None, "cost": None}


def walk_order(traces: list[Trace]) -> list[TraceEntry]:
    """The partner's execution order over its ranks: each rank's forward entries in rank
    order, then the backward entries in reverse rank order; within a rank, its log's order."""
    ranks = sorted(traces, key=lambda t: t.rank)
    forward = [e for t in ranks for e in t.entries if e.phase == "forward"]
    backward = [e for t in reversed(ranks) for e in t.entries if e.phase == "backward"]
    return forward + backward


def _load(entry: TraceEntry) -> np.ndarray:
    try:
        array = np.load(entry.file, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise TraceError(f"{entry.file}: unreadable ({error}); expected a .npy tensor") from None
    if tuple(array.shape) != entry.shape:
        raise TraceError(f"{entry.file}: shape {tuple(array.shape)}, but its log line says "
                         f"{entry.shape}; expected the same")
    return array


def _difference(got: np.ndarray, ref: np.ndarray) -> tuple[float, str | None]:
    """max |got - ref| in float64; inf with a note where got has a NaN / Inf that ref has not
    at the same place (the same non-finite value on both sides is agreement)."""
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    bad = ~np.isfinite(got)
    if bad.any():
        same = bad & (np.isnan(got) & np.isnan(ref) | (got == ref))
        if (bad & ~same).any():
            count = int(np.isnan(got).sum()), int(np.isinf(got).sum())
            return math.inf, f"NaN {count[0]}, Inf {count[1]} in the run's tensor"
    finite = np.isfinite(got) & np.isfinite(ref)
    if (~np.isfinite(ref) & np.isfinite(got)).any():
        return math.inf, "NaN / Inf in the partner's tensor only"
    d = np.abs(got[finite] - ref[finite])
    return (float(d.max()) if d.size else 0.0), None


def _doubled(slices: list[tuple[int, int]]) -> str | None:
    """Where as many pieces as parts came in, but two matched one part best (a shard offset
    wrong on a rank: each piece is some rank's correct slice, so each alone passes)."""
    if not slices or len({parts for parts, _ in slices}) != 1:
        return None
    parts = slices[0][0]
    taken = [part for _, part in slices]
    if len(taken) != parts or len(set(taken)) == parts:
        return None
    missing = sorted(set(range(parts)) - set(taken))
    twice = sorted({part for part in taken if taken.count(part) > 1})
    return (f"the ranks' pieces hold part {', '.join(map(str, twice))} of {parts} more than "
            f"once and part {', '.join(map(str, missing))} not at all")


def _fits(piece: tuple[int, ...], whole: tuple[int, ...]) -> bool:
    if len(piece) != len(whole):
        return False
    differ = [i for i in range(len(whole)) if piece[i] != whole[i]]
    return len(differ) == 1 and piece[differ[0]] > 0 and whole[differ[0]] % piece[differ[0]] == 0


def compare_traces(run_folder: str | Path, partner_folder: str | Path, naming: Naming,
                   thresholds: TraceThresholds, *, step: int, partner: str,
                   remove: bool = True, remove_partner: bool = True,
                   keep_first: bool = False) -> TraceDiff:
    """The run's trace against the partner's. `remove`: the tensor files are deleted once
    compared, the logs kept (`remove_partner` False: the partner's stay, a cached trace);
    `keep_first` keeps the first diverging pair's and the last matched pair's files. TraceError: a folder or log that is
    not a trace (the caller records it as the trace's error)."""
    started = time.time()
    run_root, partner_root = find_trace_root(run_folder), find_trace_root(partner_folder)
    peak = folder_bytes(run_root) + folder_bytes(partner_root)
    runs = [read_trace(run_root, r) for r in trace_ranks(run_root)]
    partners = [read_trace(partner_root, r) for r in trace_ranks(partner_root)]
    pool: dict[tuple[str, str], list[tuple[int, TraceEntry]]] = {}
    unpaired_run: list[str] = []
    for trace in runs:
        for entry in trace.entries:
            name = naming.partner_name(entry.module, trace.rank)
            if name is None:
                unpaired_run.append(f"{entry.label} (rank {trace.rank}): "
                                    f"{naming.why_unpaired(entry.module) or 'no counterpart'}")
                continue
            pool.setdefault((name, entry.phase), []).append((trace.rank, entry))
    used: set[tuple[int, int]] = set()  # (rank, order) of the run's entries compared
    modules: list[ModuleDiff] = []
    unpaired_partner: list[str] = []
    read = 0
    kept: set[Path] = set()
    files_of: dict[int, list[Path]] = {}  # a module diff's order -> its files
    calls: dict[tuple[str, str], int] = {}  # the partner's calls of each module and phase
    for p in walk_order(partners):
        calls[(p.module, p.phase)] = calls.get((p.module, p.phase), 0) + 1
    for p in walk_order(partners):
        candidates = [(r, e) for r, e in pool.get((p.module, p.phase), [])
                      if (r, e.order) not in used]
        same = [(r, e) for r, e in candidates if e.index == p.index
                and (e.shape == p.shape or naming.flat_view(p.module, e.shape, p.shape))]
        fitting = [(r, e) for r, e in candidates if _fits(e.shape, p.shape)]
        if calls[(p.module, p.phase)] > 1:  # the partner's calls (microbatches) each have theirs
            fitting = [(r, e) for r, e in fitting if e.index == p.index] or fitting
        pieces = same or fitting
        if not pieces:
            shapes = sorted({e.shape for _, e in candidates})
            if shapes:  # the module is there, in a shape no slice of the partner's explains
                r, e = candidates[0]
                used.add((r, e.order))
                modules.append(ModuleDiff(
                    p.module, p.phase, p.index, r, len(modules), p.shape, math.inf, 0.0,
                    thresholds.bound(0.0), False, 1,
                    f"shape {e.shape} in {e.file.name} against the partner's {p.shape} "
                    f"in {p.file.name}: expected the same, or a slice of it"))
                files_of[len(modules) - 1] = [p.file, e.file]
            else:
                unpaired_partner.append(f"{p.label}: the run has no such tensor")
            continue
        ref = _load(p)
        read += ref.nbytes
        finite = np.abs(ref[np.isfinite(ref)].astype(np.float64))  # the scale: finite values
        max_ref = float(finite.max()) if finite.size else 0.0
        worst = (-1.0, None, None)
        slices: list[tuple[int, int]] = []  # (parts, which part) of each sliced piece
        for rank, entry in pieces:
            used.add((rank, entry.order))
            got = _load(entry)
            read += got.nbytes
            note = None
            if got.shape != ref.shape and naming.flat_view(p.module, got.shape, ref.shape):
                got = got.reshape(ref.shape)  # the subject's (rows, last dim) view (a fact)
            if got.shape == ref.shape:
                view = ref
            else:  # _fits: exactly one dim differs, and divides the partner's
                dim = next(i for i in range(ref.ndim) if got.shape[i] != ref.shape[i])
                match = match_shard(np.nan_to_num(got), ref, ref.shape[dim] // got.shape[dim])
                if match is None:
                    worst = max(worst, (math.inf, rank, f"{entry.file.name}: shape "
                                        f"{got.shape}, no slice of {p.shape}"),
                                key=lambda w: w[0])
                    continue
                view, got = match.reference, got if not match.padding else match.compared
                note = match.describe().replace("TP rank", "part")
                slices.append((match.parts, match.rank))
            d, why = _difference(got, view)
            if d > worst[0]:
                worst = (d, rank, why or note)
        max_abs, rank, note = worst
        doubled = _doubled(slices)
        if doubled:  # each rank wrote its own piece: together they must cover the tensor
            max_abs, note = math.inf, doubled
        bound = thresholds.bound(max_ref)
        modules.append(ModuleDiff(p.module, p.phase, p.index, rank, len(modules), p.shape,
                                  max_abs, max_ref, bound, max_abs <= bound, len(pieces), note))
        files_of[len(modules) - 1] = [p.file, *(e.file for _, e in pieces)]
    for key, entries in pool.items():
        for rank, entry in entries:
            if (rank, entry.order) not in used:
                unpaired_run.append(f"{entry.label} (rank {rank}): the partner has no such "
                                    f"tensor")
    diff = TraceDiff(step, partner, tuple(modules), tuple(unpaired_run),
                     tuple(unpaired_partner), thresholds, {})
    if keep_first:
        for m in (diff.first_diverging, diff.last_matched):
            if m is not None:
                kept.update(files_of[m.order])
    if remove:
        for folder in {run_root, *([partner_root] if remove_partner else [])}:
            for path in folder.glob("rank_*/*.npy"):
                if path not in kept:
                    path.unlink(missing_ok=True)
    cost = {"seconds": round(time.time() - started, 3), "peak_bytes": peak,
            "tensors": sum(len(t.entries) for t in runs + partners), "bytes_read": read,
            "kept_bytes": folder_bytes(run_root) + folder_bytes(partner_root)}
    return replace(diff, cost=cost)
