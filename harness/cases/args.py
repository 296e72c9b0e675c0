"""A case's trainer flags: defaults < group defaults < case args, substituted and typed, with
flags the harness owns refused and InfiniTrain-only flags set aside."""

from __future__ import annotations

from typing import Any

from .flags import HARNESS_OWNED, INFINITRAIN_ONLY, TRAINER_DEFAULTS, coerce
from .schema import ARG_TYPES
from .substitution import substitute
from .world_size import resolve_total_batch_size, world_size


def resolve_args(layers, variables, failer):
    """Merge defaults < group defaults < case args; substitute, type, map InfiniTrain flags.
    Returns (trainer flags, world size, InfiniTrain-only flag names)."""
    merged: dict[str, tuple[Any, list]] = {}
    for location, args in layers:
        for name, value in args.items():
            merged[name] = (value, location + [name])
    flags: dict[str, Any] = dict(TRAINER_DEFAULTS)
    unsupported: dict[str, Any] = {}
    data_parallel = nthreads = None
    for name, (raw, location) in merged.items():
        fail = failer(location)
        if name in HARNESS_OWNED:
            fail(f"is set by the harness, not by a case: {HARNESS_OWNED[name]}")
        if name in INFINITRAIN_ONLY:
            unsupported[name] = substitute(raw, variables, fail)
            continue
        if name not in ARG_TYPES:
            fail(f"unknown trainer flag {name!r}; expected one of: {', '.join(sorted(ARG_TYPES))}")
        value = coerce(name, substitute(raw, variables, fail), fail)
        if name == "data_parallel":
            data_parallel = (value, location)
        elif name == "nthread_per_process":
            nthreads = (value, location)
        else:
            flags[name] = value
    world = world_size(flags, data_parallel, nthreads, failer)
    last_location = next(iter(merged.values()))[1][:-1] if merged else layers[-1][0]
    location = merged.get("total_batch_size", (None, last_location + ["total_batch_size"]))[1]
    resolve_total_batch_size(flags, world, location, failer)
    return flags, world, unsupported
