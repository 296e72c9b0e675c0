"""What is checked after every fault: no process left, every lease free, a valid results file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from filelock import FileLock, Timeout


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def launched_pids(records: Path) -> dict[int, str]:
    """pid -> case of every process the fake trainer started (itself and its children)."""
    return {r["pid"]: r["case"] for r in jsonl(records / "pids.jsonl")}


def assert_no_process_left(records: Path, within_s: float = 0.0) -> int:
    """Every pid the fake trainer recorded is gone (within_s: how long a reaper whose parent
    was killed may take to end them)."""
    pids = launched_pids(records)
    assert pids, "the fake trainer recorded no pids"
    deadline = time.monotonic() + within_s
    while True:
        left = {pid: case for pid, case in pids.items() if alive(pid)}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"
    return len(pids)


def assert_leases_free(session: Path) -> int:
    """Every lock file of the session's device leases can be taken at once (timeout 0)."""
    locks = sorted((session / "leases").glob("*.lock"))
    assert locks, f"no lease locks under {session}"
    for path in locks:
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise AssertionError(f"lease {path.name} is still held") from None
        lock.release()
    return len(locks)


def the_session(output: Path) -> Path:
    sessions = sorted((output / "sessions").iterdir())
    return sessions[-1]


def results(session: Path) -> dict[str, dict]:
    """name -> record; every line of results.jsonl must be one whole JSON record."""
    records = jsonl(session / "results.jsonl")
    names = [r["name"] for r in records]
    assert len(names) == len(set(names)), names
    for record in records:
        assert record["format"] == "harness.result/2"
    return {r["name"]: r for r in records}


def interrupt_when(session, started, sig: int, timeout_s: float = 240.0) -> str:
    """Wait until `started()` holds for the running pytest `session` (a Popen with stdout
    piped), send it `sig`, and return its output once it has ended as an interrupted session
    that printed the report command. The session is killed on any way out of this."""
    import pytest

    try:
        deadline = time.monotonic() + timeout_s
        while not started():
            assert session.poll() is None, session.stdout.read()
            assert time.monotonic() < deadline, "what was waited for never started"
            time.sleep(0.1)
        session.send_signal(sig)
        out, _ = session.communicate(timeout=timeout_s)
    finally:
        if session.poll() is None:
            session.kill()
    assert session.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "report: python -m harness.report" in out  # the summary names the report command
    return out
