"""Our single-device trainer against a plain PyTorch loop of the same model (target >= 0.95).

    python benchmarks/trainer_throughput.py                       # CPU, fp32, GPT-2 bench preset
    python benchmarks/trainer_throughput.py --device cuda --dtype bfloat16 --models gpt2 llama3

Both sides run as fresh processes with the same flags, the same model class
(harness.trainer.models), the same data order and the same step arithmetic; the plain loop
(benchmarks/plain_loop.py) has no engine, no records, no data-loader class. The two alternate in
every round (A B, then B A, ...) so drifting machine load hits both alike. tokens/s per step
comes from the trainer's steps.jsonl and the loop's own lines; the first --warmup steps of each
run are dropped; a run's figure is the median of its remaining steps; the table gives the
median over rounds and the ratio trainer / plain.

Threads: on CPU both sides run with --threads (default 1, through OMP_NUM_THREADS). On a small
machine shared with other jobs a multi-threaded OpenMP process stalls whenever another process
takes one of its cores (every parallel region waits for the descheduled thread): one such round
measured 282 tok/s for a loop that ran at 2015 tok/s the round after. One thread per process
measures the loop, which is what is compared here, and is how the harness itself runs CPU ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from tabulate import tabulate

from bench_common import PYTHON, REPO, header, median
from harness.assets.generate import ensure_assets
from harness.contracts.records import read_steps


ENV = dict(os.environ)


def run_trainer(common: list[str], out: Path) -> list[float]:
    subprocess.run([PYTHON, "-m", "harness.trainer", *common, "--output_dir", str(out)],
                   cwd=REPO, env=ENV, check=True, capture_output=True, text=True)
    return [s["tokens_per_s"] for s in read_steps(out)]


def run_plain(common: list[str]) -> list[float]:
    done = subprocess.run([PYTHON, str(REPO / "benchmarks" / "plain_loop.py"), *common],
                          cwd=REPO, env=ENV, check=True, capture_output=True, text=True)
    return [json.loads(line)["tokens_per_s"] for line in done.stdout.splitlines()
            if line.startswith("{")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", nargs="+", default=["float32"])
    p.add_argument("--models", nargs="+", default=["gpt2"])
    p.add_argument("--preset", default="bench")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--sequence_length", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--threads", type=int, default=1,
                   help="OMP_NUM_THREADS for both sides on CPU (0: leave unset)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the rows (and every round's figures) as JSON here")
    a = p.parse_args()
    if a.device == "cpu" and a.threads:
        ENV["OMP_NUM_THREADS"] = str(a.threads)
    header(f"trainer throughput vs plain loop ({a.device}, OMP_NUM_THREADS="
           f"{ENV.get('OMP_NUM_THREADS', 'unset')})")
    assets = ensure_assets(a.preset)
    tokens = a.batch_size * a.sequence_length * a.microbatches
    rows = []
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            for dtype in a.dtypes:
                common = ["--llmc_filepath", str(assets.checkpoint(model)),
                          "--input_bin", str(assets.tokens(model)),
                          "--batch_size", str(a.batch_size),
                          "--sequence_length", str(a.sequence_length),
                          "--total_batch_size", str(tokens), "--num_iteration", str(a.steps),
                          "--device", a.device, "--dtype", dtype, "--optimizer", a.optimizer,
                          "--learning_rate", "1e-4"]
                ours, plain = [], []
                for r in range(a.rounds):
                    order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
                    for side in order:
                        if side == "ours":
                            tps = run_trainer(common, Path(tmp) / f"{model}-{dtype}-{r}")
                            ours.append(median(tps[a.warmup:]))
                        else:
                            plain.append(median(run_plain(common)[a.warmup:]))
                    print(f"  {model} {dtype} round {r + 1}: trainer {ours[-1]:.0f} tok/s, "
                          f"plain {plain[-1]:.0f} tok/s", flush=True)
                ratios = [o / q for o, q in zip(ours, plain)]
                rows.append([model, dtype, a.device, tokens, f"{median(ours):.0f}",
                             f"{median(plain):.0f}", f"{median(ours) / median(plain):.3f}",
                             " ".join(f"{x:.3f}" for x in ratios),
                             "yes" if median(ours) / median(plain) >= 0.95 else "NO"])
                records.append({"model": model, "dtype": dtype, "device": a.device,
                                "tokens_per_step": tokens, "trainer_tokens_per_s": median(ours),
                                "plain_tokens_per_s": median(plain),
                                "ratio": median(ours) / median(plain),
                                "trainer_rounds": ours, "plain_rounds": plain,
                                "round_ratios": ratios})
    print()
    print(tabulate(rows, headers=["model", "dtype", "device", "tokens/step", "trainer tok/s",
                                  "plain tok/s", "ratio", "per-round ratios", ">= 0.95"],
                   disable_numparse=True))
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"device": a.device, "preset": a.preset, "steps": a.steps, "warmup": a.warmup,
             "rounds": a.rounds, "threads": ENV.get("OMP_NUM_THREADS"), "rows": records},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
