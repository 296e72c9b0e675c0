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
from pathlib import Path
from typing import Iterable, Iterator

from .costs import LayerCosts
from .errors import MAX_COUNT, LayoutError

RECORD_FORMAT = "harness.layer_timing/1"
SPECIAL = ("embedding", "lm_head")
_INFINITRAIN = re.compile(r"TransformerLayer\.(\d+)$")

Sample = tuple[str, int, "int | str", float]  # (file, rank, layer, milliseconds)


def read_profile(paths: Iterable[str | Path], warmup_samples: int = 1) -> LayerCosts:
    """Per-layer costs (ms) from timing files; embedding / lm_head costs are 0 when not recorded."""
    if isinstance(warmup_samples, bool) or not isinstance(warmup_samples, int) or warmup_samples < 0:
        raise LayoutError(f"--warmup-samples must be an integer >= 0, got {warmup_samples!r}")
    paths = [str(p) for p in paths]
    if not paths:
        raise LayoutError("no profile files given")
    streams: dict[tuple[str, int, int | str], list[float]] = defaultdict(list)
    for path in paths:
        for source, rank, layer, ms in _read_file(path):
            streams[(source, rank, layer)].append(ms)
    kept: dict[int | str, list[float]] = defaultdict(list)
    total: dict[int | str, int] = defaultdict(int)
    for (_, _, layer), values in streams.items():
        kept[layer] += values[warmup_samples:]
        total[layer] += len(values)
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
    cost = {layer: float(statistics.median(values)) for layer, values in kept.items()}
    return LayerCosts(tuple(cost[i] for i in layers), cost.get("embedding", 0.0), cost.get("lm_head", 0.0))


def _read_file(path: str) -> Iterator[Sample]:
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
        if sample is not None:
            found = True
            yield sample
    if not found:
        raise LayoutError(f"{path}: no layer timing records; expected {RECORD_FORMAT} JSON lines or "
                          f"InfiniTrain 'TransformerLayer.<i> <device> <host_us> <device_us> <peak>' lines")


def _json_sample(path: str, lineno: int, line: str) -> Sample:
    def bad(why: str) -> LayoutError:
        return LayoutError(f"{path}:{lineno}: {why}; expected a {RECORD_FORMAT} record "
                           f'{{"format", "step", "layer", "forward_ms", "backward_ms", "rank"}}')

    try:
        rec = json.loads(line)
    except json.JSONDecodeError as err:
        raise bad(f"not JSON ({err.msg})") from None
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
    return path, rec["rank"], layer, float(times[0]) + float(times[1])


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
    return path, 0, int(match.group(1)), (device_us if device_us > 0 else host_us) / 1000.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)
