"""harness.results.records: appends from several processes lose nothing; unknown fields are
refused; NaN is written JSON-safe."""

from __future__ import annotations

import multiprocessing

import pytest

from harness.results import ResultsWriter, new_record, read_results


def _append(path, worker):
    writer = ResultsWriter(path)
    for i in range(50):
        writer.append(new_record(status="passed", name=f"{worker}-{i}", errors=["x" * 2000]))


def test_results_appends_lose_nothing_across_processes(tmp_path):
    path = tmp_path / "results.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(path, w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    records = read_results(path)
    assert sorted(r["name"] for r in records) == sorted(f"{w}-{i}" for w in range(3) for i in range(50))
    with pytest.raises(ValueError, match="unknown fields"):
        ResultsWriter(path).append(new_record(status="passed", bogus=1))
    ResultsWriter(path).append(new_record(status="failed", loss={"max_abs_diff": float("nan")}))
    assert read_results(path)[-1]["loss"]["max_abs_diff"] == "nan"
