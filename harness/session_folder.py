"""A new session's folder under `<output>/sessions`: named by its start time, so name order is
time order."""

from __future__ import annotations

import os
import time
from pathlib import Path


def new_session_dir(sessions: Path) -> Path:
    # Time first, so name order is time order; the pid and a counter keep two sessions apart
    # even when one process starts both within a second (pytester, IDE runners).
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    candidate, n = sessions / stem, 1
    while candidate.exists():
        n += 1
        candidate = sessions / f"{stem}-{n}"
    return candidate
