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
    settings.py        Settings (what it is given), Outcome (what it returns), Settings.from_options:
                       the session's Settings from its options (device kind, slots, lease folder)
    record.py          the result record, assembled from the stages' results: layout, throughput
    planned_layout.py  the layout the flags ask for, before the run
    checkpoints.py     checkpoints a foreign trainer saves: announced, moved under the session,
                       waited for by the cases that resume from them
    diagnosis.py       the failure text of a crashed, hung or differing run
    calibrate.py       --harness-calibrate: the reference repeats and passing cases' noise,
                       merged at session end; the thresholds a case is judged with
"""

from .case_runner import CaseRunner, make_backend
from .settings import Outcome, Settings

__all__ = ["CaseRunner", "Outcome", "Settings", "make_backend"]
