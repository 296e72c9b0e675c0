"""What the pytest plugin costs on top of the runs it launches, and references under -n 2.

    python benchmarks/harness_overhead.py [--rounds 3]

A temporary config (tag `overhead`, the tiny synthetic assets, 4 steps) with two cases, `pp2`
and `dp2`, on GPT-2 and LLaMA 3: four items, two reference keys (one per model: the cases share
their hyper-parameters). Each round:

- plugin: `python -m pytest CONFIG -m overhead --gpus 2 --harness-output DIR
  --harness-reference-cache FRESH` (serial, a fresh reference cache, so it builds both
  references); wall time from launch to exit;
- bare: the very commands that session launched, taken from its results.jsonl (each reference's
  `reference.command` once, then every case's `command`), run one after another; wall time.

Plugin and bare alternate (round 1 plugin first, round 2 bare first, ...); the ratio plugin /
bare per round and its median are reported (target <= 1.10). Then once under `-n 2` with a fresh
reference cache: reference builds per reference key, from the records' `reference.built` and
the cache's entries (target: exactly one per key).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

from tabulate import tabulate

from bench_common import PYTHON, REPO, header, median
from harness.contracts.records import RESULTS_NAME, read_jsonl

TAG = "overhead"
CONFIG = {
    "variables": {"ITERATIONS": 4},
    "models": ["gpt2", "llama3"],
    "assets": {"preset": "tiny", "seed": 0},
    "defaults": {"batch_size": 2, "sequence_length": 32, "total_batch_size": 512,
                 "num_iteration": "@ITERATIONS@", "learning_rate": 0.001, "optimizer": "sgd",
                 "seed": 42, "dtype": "float32"},
    "test_groups": [{"tag": TAG, "tests": [
        {"id": "pp2", "args": {"pipeline_parallel": 2}},
        {"id": "dp2", "args": {"data_parallel": 2}},
    ]}],
}


def plugin(config: Path, out: Path, cache: Path, workers: int | None) -> float:
    shutil.rmtree(cache, ignore_errors=True)
    cmd = [PYTHON, "-m", "pytest", str(config), "--harness-config", str(config), "-m", TAG,
           "--gpus", "2", "--harness-output", str(out), "--harness-reference-cache", str(cache),
           "-q", "-p", "no:cacheprovider"]
    if workers:
        cmd += ["-n", str(workers)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"plugin run failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return wall


def records(out: Path) -> list[dict]:
    (results,) = out.glob(f"sessions/*/{RESULTS_NAME}")
    return read_jsonl(results, missing_ok=False)


def commands(recs: list[dict]) -> list[list[str]]:
    refs = {}
    for r in recs:
        if r["reference"] and r["reference"].get("command"):
            refs.setdefault(r["reference"]["key"] if isinstance(r["reference"]["key"], str)
                            else json.dumps(r["reference"]["key"], sort_keys=True),
                            r["reference"]["command"])
    return [*refs.values(), *(r["command"] for r in recs)]


def bare(cmds: list[list[str]]) -> float:
    # The environment the plugin gives its CPU launches (harness.launch.backends): one thread
    # per process, unbuffered output.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    for cmd in cmds:
        subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    header("harness overhead: plugin vs the bare commands it launches")
    work = REPO / "reports" / "bench-overhead"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = work / "test_config.json"
    config.write_text(json.dumps(CONFIG, indent=2))

    rows, last_cmds = [], None
    for r in range(a.rounds):
        out, cache = work / f"serial-{r}", work / f"cache-{r}"
        if r % 2 == 0 or last_cmds is None:
            t_plugin = plugin(config, out, cache, None)
            last_cmds = commands(records(out))
            t_bare = bare(last_cmds)
        else:
            t_bare = bare(last_cmds)
            t_plugin = plugin(config, out, cache, None)
            last_cmds = commands(records(out))
        rows.append([r + 1, len(last_cmds), f"{t_plugin:.1f}", f"{t_bare:.1f}",
                     f"{t_plugin / t_bare:.3f}"])
        print(f"  round {r + 1}: plugin {t_plugin:.1f} s, bare {t_bare:.1f} s", flush=True)
    ratio = median([float(row[4]) for row in rows])
    rows.append(["median", "", f"{median([float(x[2]) for x in rows]):.1f}",
                 f"{median([float(x[3]) for x in rows]):.1f}", f"{ratio:.3f}"])
    print()
    print(tabulate(rows, headers=["round", "commands", "plugin s", "bare s", "plugin / bare"],
                   disable_numparse=True))
    print(f"target plugin / bare <= 1.10: {'met' if ratio <= 1.10 else 'MISSED'}")

    out, cache = work / "xdist", work / "cache-xdist"
    t_x = plugin(config, out, cache, 2)
    recs = records(out)
    built = Counter(r["reference"]["path"] for r in recs if r["reference"]["built"])
    used = Counter(r["reference"]["path"] for r in recs)
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    workers = sorted({r["worker"] for r in recs})
    rows = [[Path(path).name, used[path], built.get(path, 0)] for path in sorted(used)]
    print(f"\n-n 2: {len(recs)} cases on workers {', '.join(workers)} in {t_x:.1f} s; "
          f"reference cache entries: {len(entries)}")
    print(tabulate(rows, headers=["reference key (cache entry)", "cases using it",
                                  "built (records)"], disable_numparse=True))
    ok = all(built.get(path, 0) == 1 for path in used) and len(entries) == len(used)
    print(f"target exactly one reference run per key: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
