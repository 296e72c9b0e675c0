"""A case's trainer flags: defaults < group defaults < case args, substituted and typed, with
flags the harness owns refused."""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

from harness.spec.flags import FLAG_TABLE, HARNESS

from .flags import HARNESS_OWNED, TRAINER_DEFAULTS, coerce
from .substitution import substitute
from .world_size import resolve_total_batch_size, world_size

# How close an unknown flag's name must be to a known one to be refused as a typo (difflib's
# ratio: batch_sise / batch_size is 0.9; a foreign trainer's own names are far from ours).
TYPO_CUTOFF = 0.85
# Flags the harness turns into a process count instead of passing them to its own trainer.
_WORLD_FLAGS = ("data_parallel", "nthread_per_process")


def resolve_args(layers, variables, failer):
    """Merge defaults < group defaults < case args; substitute and type.
    Returns (flags, args, world size): `args` are the flags exactly as the config says (after
    @VAR@ and typing; foreign flags as written), what a foreign trainer is launched with;
    `flags` are the bundled trainer's resolved flags (its defaults filled in)."""
    merged: dict[str, tuple[Any, list]] = {}
    for location, args in layers:
        for name, value in args.items():
            merged[name] = (value, location + [name])
    flags: dict[str, Any] = dict(TRAINER_DEFAULTS)
    given: dict[str, Any] = {}
    counts: dict[str, tuple] = {}
    for name, (raw, location) in merged.items():
        fail = failer(location)
        if name in HARNESS_OWNED:
            fail(f"is set by the harness, not by a case: {HARNESS_OWNED[name]}")
        if name not in FLAG_TABLE:
            typo = get_close_matches(name, FLAG_TABLE, n=1, cutoff=TYPO_CUTOFF)
            if typo:
                fail(f"unknown trainer flag {name!r}; did you mean {typo[0]!r}? (a flag the "
                     f"harness does not know is passed to a foreign trainer as written, but "
                     f"this one is a near-miss of a known flag)")
        value = coerce(name, substitute(raw, variables, fail), fail)
        if name in _WORLD_FLAGS:
            counts[name] = (value, location)
        if name != "data_parallel":  # ours alone: no trainer has it
            given[name] = value
        if name not in _WORLD_FLAGS and name in FLAG_TABLE and HARNESS in FLAG_TABLE[name].trainers:
            flags[name] = value
    world = world_size(flags, counts.get("data_parallel"), counts.get("nthread_per_process"),
                       failer)
    last_location = next(iter(merged.values()))[1][:-1] if merged else layers[-1][0]
    location = merged.get("total_batch_size", (None, last_location + ["total_batch_size"]))[1]
    resolve_total_batch_size(flags, world, location, failer)
    return flags, given, world
