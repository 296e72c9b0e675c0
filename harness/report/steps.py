"""The step numbers of a record's losses, so a plot draws each loss at the step it was taken.

A resumed run (InfiniTrain's `load=<dir>/checkpoint_step_000030`) prints steps 31..50 only:
its 20 losses are steps 31..50, not 1..20. A record says so in its optional `steps` (one int
per entry of `losses`) and `reference_steps` (per entry of `reference_losses`); a record
without them (every record written before those keys) has its steps inferred: from the
checkpoint step of its `load` flag + 1 (as the trainer's first step, InfiniTrain.first_step),
else from 1. The reference's losses are compared from the run's first step on, so without
`reference_steps` they are numbered like the run's.
"""

from __future__ import annotations

from harness.contracts.flags import resumed_first_step

def first_step(record: dict) -> int:
    """The first step the run printed: the resumed checkpoint's step + 1, else 1."""
    flags = record.get("flags")
    return resumed_first_step(flags.get("load") if isinstance(flags, dict) else None)


def _given(record: dict, key: str, n: int) -> list[int] | None:
    """record[key] when it is a list of n whole numbers, else None (absent or not usable)."""
    steps = record.get(key)
    if not isinstance(steps, list) or len(steps) != n:
        return None
    try:
        numbers = [int(s) for s in steps]
    except (TypeError, ValueError):
        return None
    if any(isinstance(s, bool) or float(s) != int(s) for s in steps):
        return None
    return numbers


def _length(record: dict, key: str) -> int:
    values = record.get(key)
    return len(values) if isinstance(values, list) else 0


def run_steps(record: dict) -> list[int]:
    """The step of each entry of `losses`."""
    n = _length(record, "losses")
    given = _given(record, "steps", n)
    if given is not None:
        return given
    first = first_step(record)
    return list(range(first, first + n))


def reference_steps(record: dict) -> list[int]:
    """The step of each entry of `reference_losses`: `reference_steps`, else the run's."""
    n = _length(record, "reference_losses")
    given = _given(record, "reference_steps", n)
    if given is not None:
        return given
    run = run_steps(record)
    if len(run) == n:
        return run
    first = run[0] if run else first_step(record)
    return list(range(first, first + n))
