"""Finished commits' verdicts, kept so that a second bisect over the same range builds and
runs nothing: one JSON file per (commit, build command, test arguments, case, threshold)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from harness.contracts.records import read_json, write_atomic

FORMAT = "harness.bisect.verdict/1"


def default_dir() -> Path:
    """$XDG_CACHE_HOME/harness/bisect, else ~/.cache/harness/bisect."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness" / "bisect"


def key(sha: str, build: str | None, test_args: list[str], case: str,
        threshold: dict | None) -> str:
    """What a verdict depends on, hashed: the commit, the build command, the session's
    arguments, the case and the threshold (None: the case's own verdict)."""
    facts = {"commit": sha, "build": build, "test_args": list(test_args), "case": case,
             "threshold": threshold}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


class VerdictCache:
    """Verdicts under a folder: `<dir>/verdicts/<key>.json`. A file that is not a verdict of
    this format (damaged, or from another version) is no verdict: the commit is tested again."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, key_: str) -> Path:
        return self.root / "verdicts" / f"{key_}.json"

    def get(self, key_: str) -> dict | None:
        entry = read_json(self.path(key_))
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key_:
            return None
        if entry.get("outcome") not in ("good", "bad", "skip"):
            return None
        return entry

    def put(self, key_: str, verdict: dict) -> Path:
        path = self.path(key_)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps({"format": FORMAT, "key": key_, **verdict},
                                             indent=2) + "\n")

    def run_dir(self, key_: str) -> Path:
        """Where the commit's build logs and harness session are kept."""
        return self.root / "runs" / key_[:16]
