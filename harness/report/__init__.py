"""Markdown reports of harness sessions: `python -m harness.report` (see cli.py), plots, and
the comparison of two sessions. Reads the plugin's results files (docs/results_format.md).

Data (records in, facts out; no markdown):

    reading.py                 one session's results, read without trusting them
    case_view.py               CaseView per record (layout, parallelism, dtype, headline
                               numbers), status counts, environment facts
    session_diff.py            two sessions matched by case: status changes, speed, settings
    throughput.py              layout groups: tokens/s of cases differing only in layout
    noise.py                   is a throughput difference outside the timed steps' spread
    steps.py                   the step number of each loss (a resumed run starts late)
    values.py                  tolerant number reading and cell formats

Writing (markdown, figures, files):

    markdown.py                one session's markdown sections (header, summary, failures,
                               cases, throughput, skipped, problems)
    session_diff_markdown.py   the markdown of a session_diff: "Against session ..."
    baseline.py                the "Baseline check" section: each case's baseline verdict
                               beside its self-check, the divergence step by step
    plots.py                   PNG figures beside the markdown
    styles.py                  the series' line styles, shared with the history's figures
    document.py                the report: sections in reading order, plots linked
    cli.py                     `python -m harness.report`
    artifacts.py               `python -m harness.report.artifacts`: failing cases' folders
"""

from .reading import NoResults, Session, latest_results, read_session, resolve

__all__ = ["NoResults", "Report", "Session", "build", "latest_results", "read_session", "resolve"]


def __getattr__(name: str):
    """`Report` and `build`, the writing side (document -> plots -> matplotlib.pyplot: 0.6 s of
    imports), loaded when first asked for: the history's CLI and the plugin read sessions
    without drawing them (PEP 562)."""
    if name in ("Report", "build"):
        from . import document

        return getattr(document, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
