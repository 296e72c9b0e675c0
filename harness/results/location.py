"""Where sessions are, shared by the plugin (which writes them) and `python -m harness.report`
(which reads them), so the report finds the latest session from any working directory.

- `HARNESS_OUTPUT`: the output folder both commands use when set (the plugin's
  `--harness-output` wins over it; the report's explicit RESULTS arguments win too).
- The last-session pointer: every session that ran harness cases writes its folder's absolute
  path to `$HARNESS_LAST_SESSION`, else `$XDG_CACHE_HOME/harness/last_session`, else
  `~/.cache/harness/last_session`. The report, given nothing, reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.contracts.records import write_atomic

OUTPUT_ENV = "HARNESS_OUTPUT"
POINTER_ENV = "HARNESS_LAST_SESSION"
DEFAULT_OUTPUT = Path("reports") / "harness"  # under the rootdir (plugin) or the cwd (report)


def env_output() -> Path | None:
    value = os.environ.get(OUTPUT_ENV)
    return Path(value).expanduser() if value else None


def pointer_file() -> Path:
    explicit = os.environ.get(POINTER_ENV)
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "harness" / "last_session"


def record_last_session(session_dir: Path) -> Path | None:
    """Point the pointer file at `session_dir`; None (and nothing raised) when it cannot be
    written: the session's results are there either way."""
    path = pointer_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, str(Path(session_dir).resolve()) + "\n")
    except OSError:
        return None
    return path


def last_session() -> Path | None:
    """The folder the pointer names, when it still exists."""
    try:
        text = pointer_file().read_text().strip()
    except OSError:
        return None
    folder = Path(text) if text else None
    return folder if folder is not None and folder.is_dir() else None
