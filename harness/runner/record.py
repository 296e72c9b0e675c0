"""The case's result record (harness.results.ResultRecord, docs/results_format.md), assembled
once, at the end, from the frozen results of the stages the case reached
(harness.runner.stages): what is known before the run, the layout it ran with, the throughput of
its steps. A stage the case did not reach leaves its fields null, as the record documents."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

from harness.cases import Case
from harness.results.result_record import Logs, Parallel, Reference, ResultRecord, Timings

from .settings import Outcome, Settings
from .stages import Reached


def assemble(case: Case, settings: Settings, nodeid: str, trainer: str, reached: Reached,
             outcome: Outcome, started_at: str, total_s: float) -> ResultRecord:
    """The record of a case from the stages it reached and its outcome."""
    plan, collected = reached.plan, reached.collected
    layout = collected.layout if collected is not None else reached.layout
    return ResultRecord(
        session=settings.session_id, worker=settings.worker, nodeid=nodeid,
        name=case.name, tag=case.tag, model=case.model, case_id=case.case_id,
        description=case.description, status=outcome.status,
        reason=outcome.message.splitlines()[0] if outcome.message else None,
        errors=[outcome.message] if outcome.status in ("failed", "error") else [],
        world_size=case.world_size,
        parallel=Parallel(pp=case.pp, tp=case.tp, dp=case.dp,
                          cp=case.cp if case.cp > 1 else None,
                          vpp=_vpp(case.vpp, reached.layout, layout),
                          sequence_parallel=bool(case.flags.get("sequence_parallel")),
                          schedule=collected.schedule if collected is not None else None),
        trainer=trainer,
        flags=plan.record_flags if plan is not None else {**case.flags, **case.args},
        passthrough_flags=list(case.passthrough), layout=layout,
        layout_text=collected.layout_text if collected is not None else None,
        device=settings.device, compare=case.compare.to_dict(),
        tolerances=case.tolerances.to_dict(),
        **_run_fields(reached), **_judged_fields(reached),
        calibration=_calibration(reached),
        output_dir=str(plan.out) if plan is not None else None,
        timings=_timings(reached, total_s),
        started_at=started_at, finished_at=now(),
    )


def _vpp(asked: int | None, *layouts: dict | None) -> int | None:
    """`parallel.vpp`: the last layout's chunks per stage that says it (a Megatron string or a
    chunk layout sets them without --virtual_pipeline_parallel), else the case's."""
    for layout in layouts:
        vpp = layout.get("vpp") if isinstance(layout, dict) else None
        if isinstance(vpp, int) and vpp >= 1:
            asked = vpp
    return asked


def _run_fields(reached: Reached) -> dict[str, Any]:
    """What the launch and collect stages give the record: the reference used, the slots, the
    command and how it ended, the logs, the steps and their throughput."""
    ref, leased, launched, collected = (reached.reference, reached.leased, reached.launched,
                                        reached.collected)
    fields: dict[str, Any] = {}
    if ref is not None:
        entry, case = ref.entry, reached.plan.case
        fields["reference"] = Reference(
            key=entry.key, path=str(entry.path), built=entry.built,
            command=entry.info.get("command"), topology=dict(case.reference_topology) or None,
            golden=entry.info.get("golden"), golden_mismatch=entry.info.get("mismatch"))
    if leased is not None:
        fields["devices"] = list(leased.slots) or None
    if launched is not None:
        result = launched.result
        fields.update(
            job=asdict(result.job) if result.job is not None else None,
            command=list(result.argv), returncode=result.returncode, timed_out=result.timed_out,
            logs=Logs(launcher_stdout=str(result.stdout), launcher_stderr=str(result.stderr),
                      ranks={r: [str(p) for p in ps] for r, ps in launched.rank_logs.items()}))
    if collected is not None:
        steps = collected.outputs.steps
        fields.update(environment=collected.environment,
                      losses=[s.get("loss") for s in steps],
                      steps=[int(s["step"]) for s in steps],
                      failing_rank=collected.failing_rank, **throughput(steps))
    return fields


def _judged_fields(reached: Reached) -> dict[str, Any]:
    """The self-check's verdict and diff summaries, the baseline check, the dumps settled."""
    plan, collected, judged, settled = (reached.plan, reached.collected, reached.judged,
                                        reached.settled)
    fields: dict[str, Any] = {
        # where gradients cannot be compared the plan said why, and the verdict keeps that
        "gradients": plan.gradients_note if plan is not None else None,
        "baseline": reached.baseline.record() if reached.baseline is not None else None,
        "trace": reached.trace}
    if collected is not None and collected.failure is not None:
        fields["self_check"] = "failed"
    if judged is not None:
        fields.update(self_check="passed" if judged.verdict.ok else "failed",
                      reference_losses=list(judged.reference_losses),
                      reference_steps=list(judged.reference_steps),
                      loss=judged.summary.get("loss"),
                      gradients=judged.summary.get("gradients", fields["gradients"]))
    if settled is not None:
        fields.update(dumps=settled.dumps, disk_bytes=settled.disk_bytes)
    return fields


def _calibration(reached: Reached) -> dict | None:
    if reached.plan is None:  # stopped before its thresholds were chosen
        return None
    settled = reached.settled
    if settled is not None and settled.fp64_ratio is not None:
        return {**reached.plan.calibration, "fp64_ratio": settled.fp64_ratio}
    return reached.plan.calibration


def _timings(reached: Reached, total_s: float) -> Timings:
    launched = reached.launched
    job = launched.result.job if launched is not None else None
    return Timings(
        reference_s=reached.reference.seconds if reached.reference is not None else None,
        lease_wait_s=reached.leased.wait_s if reached.leased is not None else None,
        queue_s=job.queue_s if job is not None else None,
        run_s=launched.result.run_s if launched is not None else None,
        compare_s=reached.compare_s, total_s=total_s)


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
