"""The session header, `session.json` beside `results.jsonl` (format harness.session/1): what
the session was (when, which config, which commit, driver and torch, the pytest arguments) and
which cases it collected, so a report can list the cases that never recorded a result.

Written by the controller process only (never by an xdist worker): once collection is done
(`finished_at` null), and again at session finish, so an interrupted session still has one.
Every write replaces the file whole (write a temporary file, then rename).

    format, session, started_at, finished_at, config_path, git_commit, git_dirty, driver,
    torch, collected (case names tag/model/id), args (the pytest command line arguments),
    trainer (the backend that ran the cases, see TRAINER_FIELDS; null in older headers),
    host (the machine the controller ran on; absent in older headers: the history's machine),
    settings (the session's settings, typed: every harness option by its name in
    harness.runner.settings.Options, the runner's as resolved, and pytest's -n / -m / -k as
    workers / marker / keyword; absent in older headers, whose `args` say what was given)

`torch` is the controller's installed torch: a fact about the bundled trainer only (a report
of a session that ran only a foreign trainer, e.g. InfiniTrain's binaries, leaves it out).

Facts that cannot be found (no git, no nvidia-smi, no torch) are null.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Sequence

from harness.contracts.records import write_atomic

SESSION_FORMAT = "harness.session/1"
HEADER_NAME = "session.json"
HEADER_FIELDS = ("format", "session", "started_at", "finished_at", "config_path", "git_commit",
                 "git_dirty", "driver", "torch", "collected", "args", "trainer", "host",
                 "settings")
# `trainer`: {"name": "harness" | "infinitrain" | "command", "version": the trainer's version
# (InfiniTrain: its build's content hash, "infinitrain-3f2a..."), or null, "build_dir": its
# build folder, or null, "device": "cpu" | "cuda", and for InfiniTrain "identified": model ->
# how its binary was known (harness.launch.binary_facts.identify: "elf", "script -> /path")},
# and "git_commit" / "git_branch" of the git work tree its build folder is in (InfiniTrain's
# checkout: the commit the nightly history and harness.bisect speak of), absent outside one.
TRAINER_FIELDS = ("name", "version", "build_dir", "device", "identified", "git_commit",
                  "git_branch")
_TIMEOUT_S = 10.0


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _output(argv: Sequence[str], cwd: str | os.PathLike | None = None) -> str | None:
    """stdout of argv (a list, never a shell string), or None when it cannot run or fails."""
    try:
        done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                              timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_facts(root: str | os.PathLike) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git work tree at root; (None, None) outside one."""
    commit = _output(["git", "rev-parse", "HEAD"], cwd=root)
    if not commit or not commit.strip():
        return None, None
    status = _output(["git", "status", "--porcelain"], cwd=root)
    return commit.strip(), (bool(status.strip()) if status is not None else None)


def driver_version() -> str | None:
    """The NVIDIA driver version(s) from nvidia-smi; None without it (CPU machines)."""
    if shutil.which("nvidia-smi") is None:
        return None
    text = _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if not text:
        return None
    versions = list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    return ", ".join(versions) or None


def torch_version() -> str | None:
    """The installed torch's version, from its package metadata (no import: torch is slow to
    import, and the controller process never needs it)."""
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def new_header(session: str, started_at: str, config_path: str | os.PathLike | None,
               root: str | os.PathLike, args: Sequence[str],
               trainer: dict | None = None, settings: dict | None = None) -> dict:
    """The header with the facts found now; `collected` empty, `finished_at` null. `trainer`:
    the backend's {name, version, build_dir, device} (trainer_fact), or None when unknown;
    `settings`: the session's (harness.runner.settings.Settings.record)."""
    commit, dirty = git_facts(root)
    return {"format": SESSION_FORMAT, "session": session, "started_at": started_at,
            "finished_at": None, "config_path": str(config_path) if config_path else None,
            "git_commit": commit, "git_dirty": dirty, "driver": driver_version(),
            "torch": torch_version(), "collected": [], "args": [str(a) for a in args],
            "trainer": trainer_fact(**trainer) if trainer is not None else None,
            "host": socket.gethostname() or None,
            "settings": settings_fact(settings) if settings is not None else None}


_JSON_SCALARS = (str, int, float, bool, type(None))


def settings_fact(settings: dict) -> dict:
    """The header's `settings` block checked to be what a header can hold: names to JSON
    scalars or lists of strings (ValueError naming the setting and its value)."""
    for name, value in settings.items():
        if not isinstance(name, str) or not (
                isinstance(value, _JSON_SCALARS)
                or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise ValueError(f"session header settings: {name!r} is {value!r}; expected a "
                             "JSON scalar or a list of strings")
    return dict(settings)


def trainer_fact(name: str, version: str | None = None,
                 build_dir: str | os.PathLike | None = None, device: str | None = None,
                 identified: dict | None = None, git_commit: str | None = None,
                 git_branch: str | None = None) -> dict:
    """The header's `trainer`: {name, version, build_dir, device} and `identified` where the
    backend says how it knew its binaries, JSON-safe (paths as text)."""
    fact = {"name": str(name), "version": str(version) if version is not None else None,
            "build_dir": str(build_dir) if build_dir is not None else None,
            "device": str(device) if device is not None else None}
    if identified:
        fact["identified"] = {str(k): str(v) for k, v in identified.items()}
    if git_commit is None and build_dir is not None and Path(build_dir).is_dir():
        # the trainer's own source revision, when its build folder is in a git work tree
        git_commit = (_output(["git", "rev-parse", "HEAD"], cwd=build_dir) or "").strip()
        branch = (_output(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=build_dir)
                  or "").strip()
        git_branch = branch if git_commit and branch and branch != "HEAD" else None
    if git_commit:
        fact["git_commit"] = str(git_commit)
    if git_branch:
        fact["git_branch"] = str(git_branch)
    return fact


def write_header(folder: str | os.PathLike, header: dict) -> Path:
    unknown = set(header) - set(HEADER_FIELDS)
    if unknown:
        raise ValueError(f"session header has unknown fields {sorted(unknown)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / HEADER_NAME
    return write_atomic(path, json.dumps({k: header.get(k) for k in HEADER_FIELDS}, indent=1)
                        + "\n")


def read_header(folder: str | os.PathLike) -> dict | None:
    try:
        data = json.loads((Path(folder) / HEADER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == SESSION_FORMAT else None
