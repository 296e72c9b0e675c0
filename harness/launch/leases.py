"""Exclusive device leases across pytest-xdist workers (and sessions sharing the lock folder).

Each device slot is a file lock `slot-<i>.lock`. A lease of k slots is taken under one guard
lock with non-blocking tries, so it is all-or-nothing and two leases never deadlock; it is
released on exit from the context, and the OS drops the locks of a process that dies.
On CPU the slots are virtual (one process each); on CUDA they are device ids.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout


class LeaseError(RuntimeError):
    pass


class DeviceLeases:
    def __init__(self, lock_dir: str | Path, slots: int, poll_s: float = 0.05) -> None:
        if slots < 0:
            raise ValueError(f"slots is {slots}; expected >= 0")
        self.lock_dir = Path(lock_dir)
        self.slots = slots
        self.poll_s = poll_s

    @contextmanager
    def lease(self, count: int, timeout_s: float | None = None) -> Iterator[list[int]]:
        if not 1 <= count <= self.slots:
            raise LeaseError(f"cannot lease {count} device(s) out of {self.slots}")
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        guard = FileLock(str(self.lock_dir / "leases.lock"))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        held: list[tuple[int, FileLock]] = []
        while True:
            with guard:
                for slot in range(self.slots):
                    lock = FileLock(str(self.lock_dir / f"slot-{slot}.lock"))
                    try:
                        lock.acquire(timeout=0)
                    except Timeout:
                        continue
                    held.append((slot, lock))
                    if len(held) == count:
                        break
                if len(held) == count:
                    break
                for _, lock in held:
                    lock.release()
                held = []
            if deadline is not None and time.monotonic() > deadline:
                raise LeaseError(f"no {count} free device(s) out of {self.slots} within {timeout_s} s")
            time.sleep(self.poll_s)
        try:
            yield [slot for slot, _ in held]
        finally:
            for _, lock in held:
                lock.release()
