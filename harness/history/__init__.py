"""The nights as a history: every session's cases appended to `<output>/history/history.jsonl`
at its finish, InfiniTrain's own run folders imported beside them, and what a series shows that
one night cannot (a throughput or memory step, a margin drifting down, a flaky build, the build
a case broke at): `python -m harness.history` (see cli.py), and the nightly report's "Since
last week" section.

    rows.py          HistoryRow: one case on one night (format harness.history/1), made from a
                     session's record and header
    store.py         the history file: locked idempotent appends, sync from the session
                     folders, bad lines kept aside
    run_folders.py   InfiniTrain run folders (logs/[<tag>/]<model>_<case>.log, run_metadata.log)
                     as rows
    findings.py      regressions from the series: steps, drift, flaky and broken builds
    drawing.py       what each figure draws (a case's points), and the worker processes that
                     draw them beside the text (no matplotlib here)
    plots.py         one figure per tag x model: tokens/s, peak memory, margin over the nights
    render.py        history.md, the "Since last week" section, the CSV
    cli.py           `python -m harness.history`
"""
