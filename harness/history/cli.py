"""`python -m harness.history [DIR] [-o FILE] [--csv FILE] [--import RUNS ...]`.

DIR: the output folder whose sessions the history follows (holding `sessions/` and
`history/`); default $HARNESS_OUTPUT when set, else ./reports/harness (the plugin's default
--harness-output). Every session under DIR/sessions/ the history lacks is appended first (so a
deleted history.jsonl is rebuilt), then each run folder given with --import, then
`history.md` and its plots are written to DIR/history/ unless -o says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.results.reading import DEFAULT_ROOT
from harness.results.location import env_output

from .drawing import Drawers
from .findings import since
from .render import TABLE_NIGHTS, document, write_csv
from .run_folders import read_run_folders
from .store import append_rows, history_path, read_history, sync


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.history",
        description="Every case over the nights: history.md (tables, plots, regressions found "
                    "from the series) and, with --csv, the rows for a spreadsheet.")
    p.add_argument("output", nargs="?", metavar="DIR",
                   help="the output folder (holding sessions/; the history is kept in "
                        "DIR/history/); default $HARNESS_OUTPUT, else ./reports/harness")
    p.add_argument("-o", "--markdown", metavar="FILE",
                   help="where history.md goes (default DIR/history/history.md); its plots "
                        "go beside it")
    p.add_argument("--csv", metavar="FILE", help="also write every row as CSV")
    p.add_argument("--import", dest="runs", action="append", default=[], metavar="RUNS",
                   help="an InfiniTrain run folder (logs/[<tag>/]<model>_<case>.log, "
                        "run_metadata.log), or a folder of them, to add to the history "
                        "(repeatable)")
    p.add_argument("--no-plots", action="store_true", help="tables only, no PNG files")
    p.add_argument("--nights", type=int, default=TABLE_NIGHTS, metavar="N",
                   help=f"the newest nights each case's table shows (default {TABLE_NIGHTS}; "
                        "0: every night); the plots, the findings and --csv take every night")
    return p


def _cpus() -> int:
    """The CPUs this process may run on (a CI job's share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.nights < 0:
        p.error(f"--nights {args.nights}: expected 0 (every night) or more")
    output = Path(args.output) if args.output else (env_output() or DEFAULT_ROOT)
    if not output.is_dir():
        print(f"harness.history: {output}: no such folder; expected an output folder "
              "(holding sessions/), e.g. the pytest run's --harness-output", file=sys.stderr)
        return 2
    # The figures' workers first, so they import matplotlib while this process reads the
    # history (it has one thread here, so forking is safe: drawing.Drawers)
    with Drawers(1 if args.no_plots else _cpus()) as drawers:
        # One read of the history (a year of nights is 73,000 rows), read again only when this
        # run added to it: a session's cases are appended at its finish, so a nightly adds none.
        history = read_history(history_path(output))
        added, notes = sync(output, history)
        imported = 0
        if args.runs:
            rows, problems = read_run_folders([Path(r) for r in args.runs])
            notes += problems
            imported = append_rows(history_path(output), rows)
            print(f"imported {imported} run{'s' * (imported != 1)} "
                  f"({len(rows) - imported} already in the history)")
        if added or imported:
            first_read = history.notes
            history = read_history(history_path(output))
            history.notes[:0] = first_read
        history.notes[:0] = notes
        for note in history.notes:
            print(f"harness.history: {note}", file=sys.stderr)
        markdown = Path(args.markdown) if args.markdown else history_path(output).with_name(
            "history.md")
        rendered = document(history, markdown.parent, with_plots=not args.no_plots,
                            table_nights=args.nights, drawers=drawers)
    found, images = rendered.found, rendered.images
    recent = since(history.rows, found=found)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(rendered.text)
    sessions = len({(r.session, r.date) for r in history.rows})
    print(f"history: {markdown.resolve()} ({sessions} session{'s' * (sessions != 1)}, "
          f"{len({r.name for r in history.rows})} cases, {added} row{'s' * (added != 1)} "
          f"added from sessions; {len(found)} finding{'s' * (len(found) != 1)}, "
          f"{len(recent)} since last week"
          + (f"; {len(images)} plot(s)" if images else "") + ")")
    if args.csv:
        print(f"csv: {write_csv(history.rows, args.csv).resolve()}")
    return 0
