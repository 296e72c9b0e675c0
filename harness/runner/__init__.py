"""Run one case end to end: files, reference (once per key), device lease, port, the run, the
diff, the result record. Plain Python (no pytest): the plugin's items call `CaseRunner.run` and
turn its Outcome into pass / fail / skip.

Per case, under the session folder:

    cases/<tag>/<model>/<id>/       the run's --output_dir (run.json, steps.jsonl, layout.txt)
        gradients/                  its gradient dump
        logs/launcher.stdout|stderr, logs/ranks/...   launcher and per-rank logs

    case_runner.py     CaseRunner: inputs, reference, lease, launch, diff; the list of stages
    stages.py          the stages a case shares with its reference (lease, port, launch,
                       collect) and every stage's frozen result
    settings.py        Options (every harness pytest option, the one table), Settings (what it is
                       given, derived from Options: device kind, slots, lease folder), Outcome
                       (what it returns)
    record.py          the result record, assembled from the stages' results: layout, throughput
    planned_layout.py  the layout the flags ask for, before the run
    checkpoints.py     checkpoints a foreign trainer saves: announced, moved under the session,
                       waited for by the cases that resume from them
    diagnosis.py       the failure text of a crashed, hung or differing run
    trace.py           the module-level trace: a failed case's step rerun with both sides
                       traced, and the baseline's step-1 module check (--harness-trace)
    replay.py          the subject's traced step replayed module by module on its own
                       inputs (harness.trainer.replay, its own process), judged: the blame
    calibrate.py       --harness-calibrate: the reference repeats and passing cases' noise,
                       merged at session end; the thresholds a case is judged with
"""

from .settings import Outcome, Settings

__all__ = ["CaseRunner", "Outcome", "Settings", "make_backend"]


def __getattr__(name: str):
    # case_runner loads numpy and the launch code (about 1 s); the plugin imports settings.py
    # (its option table) in every pytest process, so the runner loads only when asked for.
    if name in ("CaseRunner", "make_backend"):
        from . import case_runner

        return vars(case_runner)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
