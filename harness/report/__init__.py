"""Markdown reports of harness sessions: `python -m harness.report` (see cli.py), plots, and
the comparison of two sessions. Reads the plugin's results files (docs/results_format.md)."""

from .document import Report, build
from .reading import NoResults, Session, latest_results, read_session, resolve

__all__ = ["NoResults", "Report", "Session", "build", "latest_results", "read_session", "resolve"]
