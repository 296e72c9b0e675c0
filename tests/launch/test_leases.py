"""harness.launch.leases: device leases are exclusive across processes."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from harness.launch import DeviceLeases, LeaseError


def _hold(lock_dir, slots, count, out, hold_s):
    leases = DeviceLeases(lock_dir, slots, poll_s=0.01)
    with leases.lease(count) as got:
        start = time.time()
        time.sleep(hold_s)
        with open(out, "a") as stream:
            stream.write(json.dumps({"slots": got, "start": start, "end": time.time()}) + "\n")


def test_leases_are_exclusive_across_processes(tmp_path):
    out = tmp_path / "leases.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(tmp_path / "locks", 3, n, out, 0.2)) for n in (2, 2, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    for a in records:
        for b in records:
            if a is not b and set(a["slots"]) & set(b["slots"]):
                assert a["end"] <= b["start"] or b["end"] <= a["start"]
    with pytest.raises(LeaseError):
        with DeviceLeases(tmp_path / "locks", 3).lease(4):
            pass
