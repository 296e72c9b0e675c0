"""`python -m harness.report [RESULTS ...] [-o FILE] [--compare OLD]`.

RESULTS: results files, session folders, or an output folder (its latest session); default the
latest session under $HARNESS_OUTPUT when set, else the one the last pytest session wrote (its
folder is in ~/.cache/harness/last_session, harness.results.location), else the latest under
./reports/harness (the plugin's default --harness-output). The report goes to
`report.md` in the session folder unless -o says otherwise; the path is printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.results.reading import NoResults, default_results, read_session, resolve

from .document import build


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.report",
        description="Write a markdown report (with PNG plots beside it) of a harness session.")
    p.add_argument("results", nargs="*", metavar="RESULTS",
                   help="results.jsonl files, session folders, or an output folder "
                        "(default: the latest session under $HARNESS_OUTPUT when set; else "
                        "the session the last pytest run wrote, named in "
                        "~/.cache/harness/last_session; else the latest under ./reports/harness)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the markdown file (default: report.md beside the first results file)")
    p.add_argument("--compare", metavar="OLD_RESULTS",
                   help="an earlier session (file or folder) to compare against: newly failing "
                        "and passing cases, tokens/s ratios")
    p.add_argument("--history", metavar="DIR",
                   help="the output folder whose history (DIR/history/history.jsonl, "
                        "python -m harness.history) gives the \"Since last week\" section: "
                        "regressions found over the nights; default the session's own output "
                        "folder, when it keeps a history")
    p.add_argument("--no-plots", action="store_true", help="tables only, no PNG files")
    p.add_argument("--about", action="append", default=[], metavar="KEY=VALUE",
                   help="a fact for the header the session did not record, e.g. "
                        "driver=550.54 git_commit=$GITHUB_SHA config_path=... run=URL "
                        "(recorded values win; repeatable)")
    return p


def _about(pairs: list[str]) -> dict[str, str]:
    facts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--about {pair!r}: expected KEY=VALUE")
        facts[key.strip()] = value.strip()
    return facts


def _since_last_week(given: str | None, folder: Path, header: dict) -> list[str]:
    """The history's "Since last week" for this session's config: from --history, else from
    the output folder the session is in (`<output>/sessions/<session>/`) when it keeps one."""
    from harness.history.render import since_section
    from harness.history.store import history_path, read_history

    if given is not None:
        path = history_path(given)
        if not path.is_file():
            raise FileNotFoundError(f"--history {given}: no {path}; expected an output folder "
                                    "whose sessions appended to a history")
    else:
        path = history_path(folder.parent.parent)
        if folder.parent.name != "sessions" or not path.is_file():
            return []
    rows = read_history(path).rows
    return since_section(rows, config=header.get("config_path"))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        about = _about(args.about)
        paths = [resolve(r) for r in args.results] or [default_results()]
        previous = read_session([resolve(args.compare)]) if args.compare else None
    except (NoResults, ValueError) as error:
        print(f"harness.report: {error}", file=sys.stderr)
        return 2
    session = read_session(paths)
    # What the session recorded itself wins; a fact it recorded as null (no git, no
    # nvidia-smi where it ran) can still be given with --about.
    session.header = {**about, **{k: v for k, v in session.header.items() if v is not None}}
    out = Path(args.output) if args.output else paths[0].parent / "report.md"
    try:
        since = _since_last_week(args.history, paths[0].parent, session.header)
    except FileNotFoundError as error:
        print(f"harness.report: {error}", file=sys.stderr)
        return 2
    report = build(session, out, previous, with_plots=not args.no_plots,
                   since_last_week=since)
    counts = {s: sum(r["status"] == s for r in session.records)
              for s in ("passed", "failed", "skipped", "error")}
    n = len(session.records)
    print(f"report: {report.path.resolve()} ({n} case{'' if n == 1 else 's'}"
          + "".join(f"{', ' if i else ': '}{n} {s}"
                    for i, (s, n) in enumerate((s, n) for s, n in counts.items() if n))
          + (f"; {len(report.images)} plot(s)" if report.images else "")
          + (f"; {len(session.bad_lines)} unreadable lines" if session.bad_lines else "")
          + (f"; {len(session.unrecorded)} cases without a result" if session.unrecorded else "")
          + ")")
    return 0
