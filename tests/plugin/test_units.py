"""Unit tests of the plain modules: diff and its text, reference cache, leases, processes,
command templates, results records."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.cases import Tolerance
from harness.compare import Locator, compare_gradients, compare_losses, gradient_lines, loss_lines
from harness.launch import CommandBackend, DeviceLeases, LaunchSpec, LeaseError, run_process
from harness.launch.backends import parse_step_lines
from harness.reference import ReferenceCache, ReferenceError
from harness.results import ResultsWriter, new_record, read_results

TOL = Tolerance(1e-5, 0.0)


def steps(*losses):
    return [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]


def test_loss_diff_counts_first_step_and_nan():
    diff = compare_losses(steps(1.0, 2.0, float("nan"), 4.5), steps(1.0, 2.1, 3.0, 4.0), TOL)
    assert diff.mismatched == [2, 3, 4] and diff.nonfinite == [3] and diff.first == (2, 2.0, 2.1)
    text = "\n".join(loss_lines(diff))
    assert "loss is not finite (NaN / inf) at step(s) 3" in text
    assert "mismatched 3 of 4 steps (atol=1e-05 rtol=0); first diverging step 2" in text
    short = compare_losses(steps(1.0), steps(1.0, 2.0), TOL)
    assert short.missing == [2] and not short.ok
    relative = compare_losses(steps(100.001), steps(100.0), Tolerance(0, 1e-4))
    assert relative.ok  # |d| = 1e-3 <= 0 + 1e-4 * 100


def dump(folder: Path, arrays: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))


def test_gradient_diff_locates_stage_and_layer(tmp_path):
    ref = {"wte.weight": np.ones((2, 2)), "h.0.ln_1.weight": np.ones(3),
           "h.6.mlp.c_fc.weight": np.ones((2, 2)), "ln_f.weight": np.ones(3)}
    got = dict(ref)
    got["h.6.mlp.c_fc.weight"] = np.array([[1, 1.5], [1, 1]])
    got["wte.weight"] = np.array([[1, 1], [1, np.nan]])
    del got["ln_f.weight"]
    got["h.7.extra"] = np.ones(1)
    dump(tmp_path / "ref", ref)
    dump(tmp_path / "got", got)
    layout = {"chunks": [[0, 0, 3], [1, 3, 8]]}
    diff = compare_gradients(tmp_path / "got", tmp_path / "ref", TOL, Locator.from_layout(layout, "gpt2"))
    assert diff.missing == ["ln_f.weight"] and diff.extra == ["h.7.extra"]
    assert [d.name for d in diff.mismatched] == ["h.6.mlp.c_fc.weight", "wte.weight"]
    worst = diff.worst()
    assert worst[0].name == "wte.weight" and worst[0].nonfinite == 1  # NaN ranks first
    fc = next(d for d in diff.diffs if d.name == "h.6.mlp.c_fc.weight")
    assert (fc.stage, fc.layer, fc.mismatched, fc.worst_index) == ("1", "6", 1, (0, 1))
    assert fc.max_abs_diff == pytest.approx(0.5)
    text = "\n".join(gradient_lines(diff))
    assert "mismatched 2 of 3 parameters (2 of 11 elements; atol=1e-05 rtol=0)" in text
    assert "0+1 (tied embedding / lm head)" in text
    assert "gradients: 1 missing from the run: ln_f.weight" in text
    assert diff.to_dict()["per_layer"] == [  # every compared parameter, by layer in model order
        {"layer": "embedding", "stage": "0+1", "max_abs_diff": 0.0, "mismatched": 1,
         "parameters": 1},
        {"layer": 0, "stage": "0", "max_abs_diff": 0.0, "mismatched": 0, "parameters": 1},
        {"layer": 6, "stage": "1", "max_abs_diff": 0.5, "mismatched": 1, "parameters": 1}]


def test_per_layer_groups_and_orders_parameters():
    from harness.compare.diff import GradientDiff, ParameterDiff

    def p(name, stage, stages, diff, bad=0):
        return ParameterDiff(name, (1,), 1, bad, 0, diff, 0.0, (0,), 0.0, 0.0, stage=stage,
                             stages=stages)

    grads = GradientDiff(TOL, diffs=[
        p("lm_head.weight", "1 (lm head)", (1,), 0.1),
        p("h.10.mlp.c_fc.weight", "1", (1,), 0.2, 1), p("h.2.attn.c_attn.weight", "0", (0,), 0.3),
        p("h.10.attn.c_proj.weight", "1", (1,), 0.4, 1),
        p("ln_f.weight", "1 (final norm)", (1,), 0.0), p("wpe.weight", "0 (embedding)", (0,), 0.0),
        p("odd.weight", "?", (), float("nan"))])
    rows = grads.per_layer()
    assert [(r["layer"], r["stage"]) for r in rows] == [
        ("embedding", "0"), (2, "0"), (10, "1"), ("final_norm", "1"), ("head", "1"),
        ("other", "?")]
    assert rows[2] == {"layer": 10, "stage": "1", "max_abs_diff": 0.4, "mismatched": 2,
                       "parameters": 2}
    assert rows[-1]["max_abs_diff"] == "nan"  # JSON-safe, as every float in a record


def test_locator_without_layout_and_llama_head():
    loc = Locator.from_layout({"chunks": [[0, 0, 4], [1, 4, 4], [0, 4, 8], [1, 8, 8]]}, "llama3")
    assert loc.locate("h.5.attn.c_attn.weight") == ("0", "5")
    assert loc.locate("lm_head.weight") == ("1 (lm head)", "-")
    assert loc.locate("wte.weight") == ("0 (embedding)", "-")
    assert Locator.from_layout(None).locate("h.1.x") == ("?", "1")


def test_reference_cache_builds_once_reuses_and_rebuilds_corrupt(tmp_path):
    cache = ReferenceCache(tmp_path)
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "steps.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        dump(folder / "gradients", {"a": [1.0]})
        return {"command": ["x"]}

    key = {"model": "gpt2", "flags": {"a": 1}}
    first = cache.get_or_build(key, build)
    assert first.built and len(calls) == 1
    again = cache.get_or_build(key, build)
    assert not again.built and again.info == {"command": ["x"]} and len(calls) == 1
    np.save(first.gradients_dir / "a.npy", np.array([2.0], np.float32))  # corrupted content
    assert cache.get_or_build(key, build).built and len(calls) == 2
    (first.path / "COMPLETE.json").unlink()  # half-written entry: no marker
    assert cache.get_or_build(key, build).built and len(calls) == 3
    assert cache.get_or_build({"model": "gpt2", "flags": {"a": 2}}, build).built

    def failing(folder):
        raise ReferenceError("boom")

    with pytest.raises(ReferenceError):
        cache.get_or_build({"model": "llama3"}, failing)
    assert not any(p.name.startswith(".llama3") and "tmp" in p.name for p in tmp_path.iterdir())
    assert not any(p.name.startswith("llama3") for p in tmp_path.iterdir())


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


def test_timeout_kills_the_whole_process_group(tmp_path):
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(c.pid, flush=True); time.sleep(60)")
    result = run_process([sys.executable, "-c", script], os.environ, 1.0,
                         tmp_path / "out", tmp_path / "err")
    assert result.timed_out and result.returncode is None and not result.ok
    child = int((tmp_path / "out").read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_command_template_builds_argv_lists(tmp_path):
    backend = CommandBackend(["{python}", "train.py", "--np={world_size}", "{flags}", "--out", "{output_dir}"],
                             version="v1")
    spec = LaunchSpec(case="t/gpt2/x", model="gpt2", flags={"pipeline_parallel": 2, "sequence_parallel": True},
                      world_size=2, checkpoint=Path("c"), input_bin=Path("i"), output_dir=Path("o d"),
                      gradients_dir=None, log_dir=tmp_path, port=1234)
    assert backend.command(spec)[1:] == ["train.py", "--np=2", "--pipeline_parallel=2",
                                         "--sequence_parallel=true", "--out", "o d"]
    with pytest.raises(ValueError, match="unknown placeholder {nprocs}"):
        CommandBackend(["run", "{nprocs}"])


def test_step_lines_parse_infinitrain_format():
    text = ("noise\nstep    1/2 | train loss 5.250158 | lr 1.00e-04 | (12.3 ms | 4150 tok/s | "
            "peak used: 123 MB | DP=1, TP=1, PP=2)\n"
            "step    2/2 | train loss nan | lr 1.00e-04 | (10.0 ms | 5000 tok/s | DP=1, TP=1, PP=2)\n")
    parsed = parse_step_lines(text)
    assert parsed[0] == {"step": 1, "loss": 5.250158, "lr": 1e-4, "step_time_ms": 12.3,
                         "tokens_per_s": 4150.0, "peak_memory_mb": 123.0}
    assert np.isnan(parsed[1]["loss"]) and parsed[1]["peak_memory_mb"] is None


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
