"""Per-layer timing records, as the trainer's `--profile_layers FILE` writes them, turned into costs.

Our format, `harness.layer_timing/1`: JSON lines, one object per sample (one layer's forward and
backward on one microbatch, on one rank):

    {"format": "harness.layer_timing/1", "step": 3, "layer": 5, "forward_ms": 1.91, "backward_ms": 3.87, "rank": 0}

`layer` is a transformer layer index, or "embedding", or "lm_head" (final norm + lm head + loss).
Other keys are allowed and ignored. Blank lines are skipped.

InfiniTrain's PROFILE_MODE text records are read too: lines
`TransformerLayer.<i>  <device>  <host_us>  <device_us>  <peak>`; the device time is used when it
is non-zero, else the host time (both microseconds). Other lines (headers, other modules) are
skipped. A file is read as JSON lines when its first non-blank line starts with "{".

A stream is one layer's samples from one rank of one file, in file order. The first
`warmup_samples` of each stream are dropped (allocator warm-up, autotuning). A layer's cost is
the median of its remaining samples' forward + backward time, in milliseconds: the median, not the
mean, because a single stall (a GC pause, a checkpoint write) should not move a layer.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

from .costs import LayerCosts
from .errors import MAX_COUNT, LayoutError
from .schedules import SPLIT_BACKWARD
from .step_model import StepCosts, split_total

RECORD_FORMAT = "harness.layer_timing/1"
MEMORY_FORMAT = "harness.stage_memory/1"
MEMORY_FIELDS = ("activation_bytes", "parameter_bytes")
STAGE_FIELDS = ("peak_activation_bytes", "held_activation_bytes", "parameter_bytes", "gradient_bytes",
                "optimizer_bytes", "allocator_peak_bytes")
SPECIAL = ("embedding", "lm_head")
_INFINITRAIN = re.compile(r"TransformerLayer\.(\d+)$")



class Sample(NamedTuple):
    file: str
    rank: int
    layer: int | str
    forward: float  # ms, summed over the step's microbatches
    backward: float
    extra: dict  # the record's other fields (microbatches, memory figures, chunk, chunks)


@dataclass(frozen=True)
class StepProfile:
    costs: StepCosts  # per microbatch where the microbatch count is recorded, else per step
    microbatches: int | None
    shape: tuple[int, int] | None  # (pp, vpp) recorded; None: an older profile does not say
    memory_missing: str | None  # why costs has no memory figures; None: it has them
    times_refused: str | None  # why the backward times are not the layers' (split_backward_times)
    stage_memory: dict[int, dict]  # rank -> median of each STAGE_FIELDS figure over kept steps
    files: tuple[str, ...]


def read_profile(paths: Iterable[str | Path], warmup_samples: int = 1) -> LayerCosts:
    """Per-layer costs (ms) from timing files; embedding / lm_head costs are 0 when not recorded."""
    kept, _, _, _ = _kept_samples(paths, warmup_samples)
    cost = {layer: float(statistics.median(s.forward + s.backward for s in samples))
            for layer, samples in kept.items()}
    layers = sorted(k for k in cost if isinstance(k, int))
    return LayerCosts(tuple(cost[i] for i in layers), cost.get("embedding", 0.0), cost.get("lm_head", 0.0))


def read_step_profile(paths: Iterable[str | Path], warmup_samples: int = 1) -> StepProfile:
    """Forward / backward per microbatch, memory figures, the recorded shape (module doc)."""
    kept, all_samples, stage_records, files = _kept_samples(paths, warmup_samples)
    counts = [s.extra.get("microbatches") for samples in kept.values() for s in samples]
    microbatches = None
    if counts and all(_is_int(c) and c > 0 for c in counts):
        microbatches = int(statistics.median(counts))
    per = microbatches or 1

    def median(layer, field: str) -> float:
        return float(statistics.median(getattr(s, field) for s in kept[layer])) / per

    def figure(layer, field: str) -> float:
        return float(statistics.median(s.extra[field] for s in kept[layer]))

    layers = sorted(k for k in kept if isinstance(k, int))
    missing = _memory_missing(files, kept)
    memory = {}
    if missing is None:
        memory = {"activation": tuple(figure(i, "activation_bytes") for i in layers),
                  "parameters": tuple(figure(i, "parameter_bytes") for i in layers),
                  **{f"{key}_memory": (figure(key, "activation_bytes"), figure(key, "parameter_bytes"))
                     for key in SPECIAL if key in kept}}
    costs = StepCosts(tuple(median(i, "forward") for i in layers), tuple(median(i, "backward") for i in layers),
                      **{key: (median(key, "forward"), median(key, "backward")) for key in SPECIAL if key in kept},
                      **memory)
    return StepProfile(costs, microbatches, _shape(all_samples), missing, split_backward_times(all_samples),
                       _stage_medians(stage_records, warmup_samples), tuple(files))


def split_backward_times(samples: list[Sample]) -> str | None:
    """Why the samples' backward times are short, or None: under a zero-bubble schedule the
    trainer's layer hooks see the input pass of each backward and not the weight pass
    (harness/trainer/profiling.py)."""
    for s in samples:
        schedule = s.extra.get("schedule")
        if schedule in SPLIT_BACKWARD:
            return (f"{s.file}: recorded under the {schedule} schedule, which splits each backward "
                    f"into an input pass and a weight pass, and the layer hooks time the input pass "
                    f"only, so its backward times are short by the weight pass; expected a profile "
                    f"under a schedule with whole backwards: the same run with --pipeline_schedule "
                    f"GPipe, or the uniform layout's default (Interleaved1F1B / 1F1B)")
    return None


def _memory_missing(files: list[str], kept: dict) -> str | None:
    for layer, samples in kept.items():
        for s in samples:
            for field in MEMORY_FIELDS:
                value = s.extra.get(field)
                if not _is_time(value):
                    return (f"{s.file}: the record of layer {layer!r} (rank {s.rank}) has "
                            f"{field} {value!r}; expected a number of bytes >= 0 (a profile from "
                            f"before memory was recorded: profile again with --profile_layers)")
    return None


def _shape(samples: list[Sample]) -> tuple[int, int] | None:
    """(pp, vpp) of the run that wrote the samples: the distinct layer sets of the ranks, and the
    ranks' chunk count."""
    chunks = {s.extra.get("chunks") for s in samples}
    if not all(_is_int(c) and c > 0 for c in chunks):
        return None
    held: dict[tuple[str, int], set] = defaultdict(set)
    for s in samples:
        held[(s.file, s.rank)].add(s.layer)
    return len({frozenset(v) for v in held.values()}), max(chunks)


def _stage_medians(records: list[tuple[str, dict]], warmup_samples: int) -> dict[int, dict]:
    streams: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for file, rec in records:
        streams[(file, rec["rank"])].append(rec)
    result: dict[int, dict] = {}
    for (_, rank), recs in sorted(streams.items()):
        kept = recs[warmup_samples:] or recs[-1:]
        result[rank] = {field: (float(statistics.median(r[field] for r in kept))
                                if all(_is_time(r.get(field)) for r in kept) else None)
                        for field in STAGE_FIELDS}
    return result


def _kept_samples(paths: Iterable[str | Path], warmup_samples: int):
    """(samples kept per layer, every sample, stage memory records, files), checked."""
    if isinstance(warmup_samples, bool) or not isinstance(warmup_samples, int) or warmup_samples < 0:
        raise LayoutError(f"--warmup-samples must be an integer >= 0, got {warmup_samples!r}")
    paths = [str(p) for p in paths]
    if not paths:
        raise LayoutError("no profile files given")
    streams: dict[tuple[str, int, int | str], list[Sample]] = defaultdict(list)
    stage_records: list[tuple[str, dict]] = []
    for path in paths:
        for sample in _read_file(path, stage_records):
            streams[(sample.file, sample.rank, sample.layer)].append(sample)
    kept: dict[int | str, list[Sample]] = defaultdict(list)
    total: dict[int | str, int] = defaultdict(int)
    every: list[Sample] = []
    for (_, _, layer), values in streams.items():
        kept[layer] += values[warmup_samples:]
        total[layer] += len(values)
        every += values
    layers = sorted(k for k in total if isinstance(k, int))
    if not layers:
        raise LayoutError(f"{', '.join(paths)}: no transformer layer records; expected records for layers 0..n-1")
    if layers[-1] >= MAX_COUNT:  # bounded before range() below is built from it
        raise LayoutError(f"{', '.join(paths)}: a record names layer {layers[-1]}; expected layers "
                          f"below {MAX_COUNT}")
    missing = sorted(set(range(layers[-1] + 1)) - set(layers))
    if missing:
        raise LayoutError(f"{', '.join(paths)}: no records for layer(s) {', '.join(map(str, missing))}; "
                          f"expected every layer 0..{layers[-1]}")
    for layer, count in total.items():
        if not kept[layer]:
            raise LayoutError(f"{', '.join(paths)}: layer {layer} has {count} sample(s), all dropped as "
                              f"warm-up (--warmup-samples {warmup_samples}); expected more samples, e.g. more steps")
    return dict(kept), every, stage_records, paths


def _read_file(path: str, stage_records: list[tuple[str, dict]]) -> Iterator[Sample]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise LayoutError(f"{path}: cannot read profile: {err}") from None
    content = [(i + 1, line.strip()) for i, line in enumerate(lines) if line.strip()]
    if not content:
        raise LayoutError(f"{path}: profile is empty; expected {RECORD_FORMAT} JSON lines or "
                          f"InfiniTrain 'TransformerLayer.<i> ...' lines")
    reader = _json_sample if content[0][1].startswith("{") else _infinitrain_sample
    found = False
    for lineno, line in content:
        sample = reader(path, lineno, line)
        if isinstance(sample, dict):
            stage_records.append((path, sample))
        elif sample is not None:
            found = True
            yield sample
    if not found:
        raise LayoutError(f"{path}: no layer timing records; expected {RECORD_FORMAT} JSON lines or "
                          f"InfiniTrain 'TransformerLayer.<i> <device> <host_us> <device_us> <peak>' lines")


def _json_sample(path: str, lineno: int, line: str) -> Sample | dict:
    def bad(why: str) -> LayoutError:
        return LayoutError(f"{path}:{lineno}: {why}; expected a {RECORD_FORMAT} record "
                           f'{{"format", "step", "layer", "forward_ms", "backward_ms", "rank"}}')

    try:
        rec = json.loads(line)
    except json.JSONDecodeError as err:
        raise bad(f"not JSON ({err.msg})") from None
    if isinstance(rec, dict) and rec.get("format") == MEMORY_FORMAT:
        if not _is_int(rec.get("rank")) or rec["rank"] < 0:
            raise bad(f"rank {rec.get('rank')!r} of a {MEMORY_FORMAT} record is not an integer >= 0")
        return rec
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise bad(f"format is {rec.get('format') if isinstance(rec, dict) else None!r}")
    for key in ("step", "rank"):
        if not _is_int(rec.get(key)) or rec[key] < 0:
            raise bad(f"{key} {rec.get(key)!r} is not an integer >= 0")
    layer = rec.get("layer")
    if not ((_is_int(layer) and layer >= 0) or layer in SPECIAL):
        raise bad(f"layer {layer!r} is not a layer index >= 0, 'embedding' or 'lm_head'")
    times = [rec.get("forward_ms"), rec.get("backward_ms")]
    for key, value in zip(("forward_ms", "backward_ms"), times):
        if not _is_time(value):
            raise bad(f"{key} {value!r} is not a finite number >= 0")
    extra = {k: v for k, v in rec.items() if k not in ("format", "step", "layer", "forward_ms", "backward_ms", "rank")}
    return Sample(path, rec["rank"], layer, float(times[0]), float(times[1]), extra)


def _infinitrain_sample(path: str, lineno: int, line: str) -> Sample | None:
    fields = line.split()
    match = _INFINITRAIN.match(fields[0])
    if not match:
        return None
    try:
        if len(fields) < 4:
            raise ValueError
        host_us, device_us = float(fields[2]), float(fields[3])
    except ValueError:
        raise LayoutError(f"{path}:{lineno}: malformed record {line!r}; expected "
                          f"'TransformerLayer.<i> <device> <host_us> <device_us> <peak>'") from None
    if not (_is_time(host_us) and _is_time(device_us)):
        raise LayoutError(f"{path}:{lineno}: times in {line!r} must be finite numbers >= 0")
    # One time per record, forward and backward together: split as StepCosts.from_layer_costs does.
    forward, backward = split_total((device_us if device_us > 0 else host_us) / 1000.0)
    return Sample(path, 0, int(match.group(1)), forward, backward, {})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)
