"""The case's result record (harness.results.ResultRecord, docs/results_format.md): what is
known before the run, the layout it ran with, and the throughput of its steps."""

from __future__ import annotations

import math
import time
from typing import Any

from harness.cases import Case
from harness.results.result_record import Parallel, ResultRecord

from .settings import Settings


def start_record(case: Case, settings: Settings, nodeid: str) -> ResultRecord:
    return ResultRecord(
        session=settings.session_id, worker=settings.worker, nodeid=nodeid,
        name=case.name, tag=case.tag, model=case.model, case_id=case.case_id,
        description=case.description, world_size=case.world_size,
        parallel=Parallel(pp=case.pp, tp=case.tp, dp=case.dp, vpp=case.vpp,
                          sequence_parallel=bool(case.flags.get("sequence_parallel"))),
        flags={**case.flags, **case.args}, passthrough_flags=list(case.passthrough),
        device=settings.device,
        compare=case.compare.to_dict(), tolerances=case.tolerances.to_dict(),
        started_at=now(),
    )


def set_layout(record: ResultRecord, layout: dict | None) -> None:
    """The record's layout, and `parallel.vpp` from it: a Megatron string or a chunk layout
    sets the chunks per stage without --virtual_pipeline_parallel."""
    record.layout = layout
    vpp = layout.get("vpp") if isinstance(layout, dict) else None
    if isinstance(vpp, int) and vpp >= 1 and record.parallel is not None:
        record.parallel.vpp = vpp


def throughput(steps: list[dict]) -> dict[str, Any]:
    timed = steps[1:] if len(steps) > 1 else steps  # the first step includes warm-up
    def mean(key):
        values = [float(s[key]) for s in timed if s.get(key) is not None]
        values = [v for v in values if math.isfinite(v)]
        return sum(values) / len(values) if values else None
    peaks = [float(s["peak_memory_mb"]) for s in steps if s.get("peak_memory_mb") is not None]
    # Every timed step, so a report can tell a throughput difference from step-to-step noise.
    times = [float(s["step_time_ms"]) for s in timed if s.get("step_time_ms") is not None]
    return {"tokens_per_s": mean("tokens_per_s"), "step_time_ms": mean("step_time_ms"),
            "step_times_ms": [t for t in times if math.isfinite(t)] or None,
            "peak_memory_mb": max(peaks) if peaks else None}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
