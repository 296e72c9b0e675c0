"""The single-device reference of each key, built once and reused.

Key: the model, its files' content hashes, the hyper-parameters (batch, sequence, total batch,
iterations, lr, optimizer, seed, dtype, ...), the device kind and the trainer version. The entry
`<root>/<model>-<digest>/` is built under a file lock on the key (so pytest-xdist workers and
concurrent sessions build it once), into a temporary folder that is renamed into place after a
completion marker (COMPLETE.json: the key and every file's size and sha256) is written. An entry
whose marker is missing, unreadable, for another key, or whose files no longer match it is
rebuilt, never trusted.

Every use writes the entry's LAST_USED (`{"last_used": epoch seconds, "at": local time}`, outside
the marker's file list), so `harness.reference.prune` can evict the least recently used entries
to keep the cache under a size bound (`--harness-reference-cache-max-gb`,
`python -m harness.reference prune`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from harness.contracts.records import STEPS_NAME, write_atomic

MARKER = "COMPLETE.json"
MARKER_FORMAT = "harness.reference/1"
LAST_USED = "LAST_USED"


class ReferenceError(RuntimeError):
    """The reference run failed; the message says why (command, log tail)."""


def file_sha256(path: str | os.PathLike, _cache: dict = {}) -> str:
    """sha256 of a file's content, memoized within the process on the file's identity (device,
    inode, size, mtime), which a rename keeps: a reference built in a scratch folder and renamed
    into the cache is not hashed again when it is first reused."""
    stat = Path(path).stat()
    memo = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if memo not in _cache:
        digest = hashlib.sha256()
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        _cache[memo] = digest.hexdigest()
    return _cache[memo]


def reference_key(model: str, files: dict[str, str | os.PathLike], flags: dict[str, Any],
                  device: str, trainer_version: str) -> dict:
    return {
        "model": model,
        "files": {role: file_sha256(path) for role, path in sorted(files.items())},
        "flags": dict(sorted(flags.items())),
        "device": device,
        "trainer": trainer_version,
    }


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ReferenceEntry:
    path: Path
    key: dict
    built: bool  # True when this call ran the reference; False when it reused the cache
    info: dict  # what the builder returned (command, timings)

    @property
    def steps_file(self) -> Path:
        return self.path / STEPS_NAME

    @property
    def gradients_dir(self) -> Path:
        return self.path / "gradients"


class ReferenceCache:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def entry_name(self, key: dict) -> str:
        return f"{key['model']}-{key_digest(key)}"

    def get_or_build(self, key: dict, build: Callable[[Path], dict]) -> ReferenceEntry:
        """The valid entry of `key`, running `build(folder)` to fill a fresh folder if there is
        none. `build` raises ReferenceError on failure; nothing is cached then."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = self.entry_name(key)
        path = self.root / name
        with FileLock(str(self.root / f".{name}.lock")):
            marker = self.valid_marker(path, key)
            if marker is not None:
                touch_last_used(path)
                return ReferenceEntry(path, key, built=False, info=marker.get("info", {}))
            scratch = self.root / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            scratch.mkdir()
            try:
                info = build(scratch)
                files = {}
                for file in sorted(p for p in scratch.rglob("*") if p.is_file()):
                    rel = file.relative_to(scratch).as_posix()
                    files[rel] = {"bytes": file.stat().st_size, "sha256": file_sha256(file)}
                marker = {"format": MARKER_FORMAT, "key": key, "files": files, "info": info,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
                (scratch / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
                if path.exists():
                    stale = self.root / f".{name}.stale-{uuid.uuid4().hex[:8]}"
                    os.replace(path, stale)
                    shutil.rmtree(stale, ignore_errors=True)
                os.replace(scratch, path)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            touch_last_used(path)
            return ReferenceEntry(path, key, built=True, info=info)

    @staticmethod
    def valid_marker(path: Path, key: dict) -> dict | None:
        try:
            marker = json.loads((path / MARKER).read_text())
            if marker.get("format") != MARKER_FORMAT or marker.get("key") != key:
                return None
            if STEPS_NAME not in marker["files"]:
                return None
            for rel, expected in marker["files"].items():
                file = path / rel
                if file.stat().st_size != expected["bytes"] or file_sha256(file) != expected["sha256"]:
                    return None
            return marker
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def touch_last_used(path: Path) -> None:
    """Record a use of the entry (atomically: a reader never sees half a file)."""
    try:
        write_atomic(path / LAST_USED, json.dumps(
            {"last_used": time.time(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    except OSError:  # a read-only cache still serves references
        pass


def last_used(path: Path) -> float:
    """When the entry was last used (epoch seconds): its LAST_USED, else its marker's mtime."""
    try:
        return float(json.loads((path / LAST_USED).read_text())["last_used"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return (path / MARKER).stat().st_mtime
        except OSError:
            return 0.0
