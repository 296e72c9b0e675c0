"""Markdown reports of harness sessions: `python -m harness.report` (see cli.py), plots, and
the comparison of two sessions. Reads the plugin's results files (docs/results_format.md).
What it shares with the history sits below both: reading a session (harness.results.reading),
numbers out of records and cell formats (harness.results.values), throughput noise
(harness.results.noise), the figures' line styles (harness.styles).

Data (records in, facts out; no markdown):

    case_view.py               CaseView per record (layout, parallelism, dtype, headline
                               numbers), status counts, environment facts
    session_diff.py            two sessions matched by case: status changes, speed, settings
    throughput.py              layout groups: tokens/s of cases differing only in layout
    steps.py                   the step number of each loss (a resumed run starts late)
    trace.py                   a case's module traces (`trace`, `baseline.trace`): the points
                               of the picture, first diverging / last matched, its markdown

Writing (markdown, figures, files):

    markdown.py                one session's markdown sections (header, summary, failures,
                               cases, throughput, skipped, problems)
    session_diff_markdown.py   the markdown of a session_diff: "Against session ..."
    baseline.py                the "Baseline check" section: each case's baseline verdict
                               beside its self-check, the divergence step by step
    plots.py                   PNG figures beside the markdown
    trace_plot.py              the module trace picture of each traced case
    document.py                the report: sections in reading order, plots linked
    cli.py                     `python -m harness.report`
    artifacts.py               `python -m harness.report.artifacts`: failing cases' folders
"""

from harness.results.reading import NoResults, Session, latest_results, read_session, resolve

__all__ = ["NoResults", "Report", "Session", "build", "latest_results", "read_session", "resolve"]


def __getattr__(name: str):
    """`Report` and `build`, the writing side (document -> plots -> matplotlib.pyplot: 0.6 s of
    imports), loaded when first asked for: the history's CLI and the plugin read sessions
    without drawing them (PEP 562)."""
    if name in ("Report", "build"):
        from . import document

        return getattr(document, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
