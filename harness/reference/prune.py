"""List the reference cache and keep it under a size bound, least recently used first.

    python -m harness.reference prune [--root DIR] [--max-gb N] [--list] [--min-idle-s S]

`--list` prints every entry (size, last use, model) and the total, and removes nothing. Without
it, entries are evicted in order of last use (LAST_USED, written on every use; the marker's
mtime for entries older than that file) until the cache holds at most --max-gb (default 20).
An entry used in the last --min-idle-s seconds (default 300: another session may be reading
it), or whose lock is held (being built or verified), is never evicted, so the bound can be
exceeded until a later prune. An evicted entry is renamed away under its lock, then deleted:
a session never sees half of one. The pytest plugin runs the same prune at session end with
`--harness-reference-cache-max-gb`. Plain Python.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from harness.compare.dumps import folder_bytes

from .cache import MARKER, last_used

DEFAULT_MAX_GB = 20.0


@dataclass(frozen=True)
class CacheEntry:
    name: str
    path: Path
    bytes: int
    last_used: float  # epoch seconds
    model: str


def list_entries(root: str | os.PathLike) -> list[CacheEntry]:
    """Every entry (a folder with a marker), least recently used first."""
    root = Path(root)
    if not root.is_dir():
        return []
    entries = []
    for path in root.iterdir():
        if path.name.startswith(".") or not path.is_dir() or not (path / MARKER).is_file():
            continue
        try:
            model = json.loads((path / MARKER).read_text())["key"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            model = "?"
        entries.append(CacheEntry(path.name, path, folder_bytes(path), last_used(path), str(model)))
    return sorted(entries, key=lambda e: (e.last_used, e.name))


def prune(root: str | os.PathLike, max_bytes: int, min_idle_s: float = 300.0,
          now: float | None = None) -> list[CacheEntry]:
    """Evict least recently used entries until the cache holds at most max_bytes; returns the
    evicted entries."""
    root = Path(root)
    entries = list_entries(root)
    total = sum(e.bytes for e in entries)
    now = time.time() if now is None else now
    evicted = []
    for entry in entries:
        if total <= max_bytes:
            break
        if now - entry.last_used < min_idle_s:
            continue
        try:
            with FileLock(str(root / f".{entry.name}.lock"), timeout=0):
                if last_used(entry.path) != entry.last_used:  # used meanwhile
                    continue
                stale = root / f".{entry.name}.evicted-{uuid.uuid4().hex[:8]}"
                os.replace(entry.path, stale)
        except (Timeout, OSError):
            continue
        shutil.rmtree(stale, ignore_errors=True)
        total -= entry.bytes
        evicted.append(entry)
    return evicted


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.reference prune",
                                description="List the reference cache and evict least recently "
                                            "used entries beyond a size bound.")
    p.add_argument("--root", default="reports/harness/reference-cache",
                   help="the cache folder (default: reports/harness/reference-cache)")
    p.add_argument("--max-gb", type=float, default=DEFAULT_MAX_GB,
                   help=f"size bound in GB (default {DEFAULT_MAX_GB:g})")
    p.add_argument("--min-idle-s", type=float, default=300.0,
                   help="never evict an entry used this recently (default 300)")
    p.add_argument("--list", action="store_true", help="list the entries; remove nothing")
    a = p.parse_args(argv)
    if a.max_gb < 0:
        p.error(f"--max-gb is {a.max_gb:g}; expected a number >= 0")
    entries = list_entries(a.root)
    if a.list:
        for e in entries:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
            print(f"{e.name}  {_gb(e.bytes)}  last used {at}  model {e.model}")
        print(f"{len(entries)} entries, {_gb(sum(e.bytes for e in entries))} in {a.root}")
        return 0
    evicted = prune(a.root, int(a.max_gb * 1e9), a.min_idle_s)
    for e in evicted:
        print(f"evicted {e.name} ({_gb(e.bytes)})")
    left = list_entries(a.root)
    print(f"{len(evicted)} evicted; {len(left)} entries, {_gb(sum(e.bytes for e in left))} "
          f"left in {a.root} (bound {a.max_gb:g} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
