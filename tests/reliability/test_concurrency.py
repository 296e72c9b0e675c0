"""Under `-n 4` on 8 device slots, many fake-backend cases of mixed sizes: no two cases ever
hold a device slot at the same time, no rendezvous port is handed out twice, and the reference
of each key runs exactly once."""

from __future__ import annotations

import itertools

from tests.plugin.conftest import fake_config, harness_args

from .checks import assert_leases_free, assert_no_process_left, jsonl, results, the_session

SIZES = [1, 2, 4, 8, 2, 1, 4, 2, 1, 2]  # data-parallel sizes: world sizes on 8 slots


def test_xdist_on_8_slots_leases_ports_and_references(pytester, harness_dir, records):
    tests = [{"id": f"slow-{i}-dp{dp}", "args": {"data_parallel": dp,
                                                  "num_iteration": 2 + i % 2}}
             for i, dp in enumerate(SIZES)]
    config = fake_config(tests, models=("gpt2", "llama3"))
    config["defaults"]["total_batch_size"] = 64  # one reference key per (model, iterations)
    command = config["trainer"]["command"]
    command[command.index("{flags}"):command.index("{flags}")] = ["--port", "{port}"]
    harness_dir(config)
    result = pytester.runpytest_subprocess(*harness_args(pytester, "-n", "4", "--gpus", "8"))
    result.assert_outcomes(passed=2 * len(SIZES))

    leases = jsonl(records / "leases.jsonl")
    assert len(leases) == 2 * len(SIZES)
    held = {slot: [] for slot in range(8)}
    for lease in leases:
        slots = [int(s) for s in lease["slots"].split(",")]
        assert len(slots) == len(set(slots)) and all(0 <= s < 8 for s in slots)
        for slot in slots:
            held[slot].append((lease["start"], lease["end"], lease["case"]))
    for slot, intervals in held.items():
        intervals.sort()
        for (_, end, case), (start, _, other) in itertools.pairwise(intervals):
            assert end <= start, f"slot {slot}: {case} and {other} overlap"
    assert max(len(v) for v in held.values()) >= 3  # slots were actually reused

    ports = [lease["port"] for lease in leases]
    assert len(set(ports)) == len(ports) and all(int(p) > 0 for p in ports)

    references = jsonl(records / "references.jsonl")
    keys = sorted((r["model"], next(a for a in r["argv"] if a.startswith("--num_iteration=")))
                  for r in references)
    assert keys == sorted(set(keys)) and len(keys) == 4, keys  # once per key

    session = the_session(pytester.path / "out")
    by_name = results(session)
    assert len(by_name) == 2 * len(SIZES)
    assert len({r["worker"] for r in by_name.values()}) > 1
    assert {tuple(r["devices"]) for r in by_name.values()} >= {tuple(range(8))}
    assert_no_process_left(records)
    assert_leases_free(session)
