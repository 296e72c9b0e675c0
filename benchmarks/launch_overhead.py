"""Per-case launch overhead: torchrun against the zygote launcher, side by side in one run.

    python benchmarks/launch_overhead.py [--rounds 3] [--steps 4]

PP2 cases of the tiny preset (the basic tag's `pp2` flags: batch 2, sequence 32, SGD, on GPT-2
and LLaMA 3), launched exactly as the harness launches them (HarnessBackend.launch with
launcher torchrun / zygote). Per run: the run's wall time (launch to exit, as the case record's
`timings.run_s`), its step time (the sum of steps.jsonl's step_time_ms) and the overhead = run
time - step time. The launchers alternate within each round (round 1 torchrun first, round 2
zygote first, ...). The zygote's one-off start (importing torch and the trainer) is reported
on its own: it is paid once per pytest worker, not per case. The first zygote run of each
model is included (nothing is warmed up besides the zygote itself).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_common import machine, median  # noqa: E402
from harness.contracts.records import read_steps  # noqa: E402

FLAGS = {"dtype": "float32", "batch_size": 2, "sequence_length": 32, "learning_rate": 0.001,
         "weight_decay": 0.0, "optimizer": "sgd", "seed": 42, "pipeline_parallel": 2,
         "total_batch_size": 512}


@dataclass(frozen=True)
class _Settings:
    launcher: str
    timeout_s: float = 600.0


def one_run(backend, assets, model: str, launcher: str, steps: int, folder: Path) -> dict:
    from harness.launch import LaunchSpec, free_port

    out = folder / f"{launcher}-{model}-{time.monotonic_ns()}"
    spec = LaunchSpec(case=f"bench/{model}/pp2", model=model,
                      flags={**FLAGS, "num_iteration": steps}, world_size=2,
                      checkpoint=assets.checkpoint(model), input_bin=assets.tokens(model, "train"),
                      output_dir=out, gradients_dir=out / "gradients", log_dir=out / "logs",
                      port=free_port(), slots=[0, 1])
    spec.log_dir.mkdir(parents=True)
    result = backend.launch(spec, _Settings(launcher))
    if not result.ok:
        raise SystemExit(f"{launcher} {model} failed: see {result.stderr}")
    step_s = sum(r["step_time_ms"] for r in read_steps(out)) / 1e3
    shutil.rmtree(out, ignore_errors=True)
    return {"launcher": launcher, "model": model, "run_s": result.duration_s, "step_s": step_s,
            "overhead_s": result.duration_s - step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    from harness.assets import ensure_assets
    from harness.launch import HarnessBackend
    from harness.launch.zygote import shared_zygote

    print(machine())
    assets = ensure_assets("tiny")
    backend = HarnessBackend(env={"OMP_NUM_THREADS": "1"})
    started = time.monotonic()
    shared_zygote().ensure()
    zygote_start_s = time.monotonic() - started
    print(f"zygote start (once per pytest worker): {zygote_start_s:.2f} s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="launch-overhead-") as tmp:
        for rnd in range(args.rounds):
            order = ("torchrun", "zygote") if rnd % 2 == 0 else ("zygote", "torchrun")
            for model in ("gpt2", "llama3"):
                for launcher in order:
                    row = one_run(backend, assets, model, launcher, args.steps, Path(tmp))
                    rows.append(row)
                    print(f"round {rnd + 1} {model:6s} {launcher:8s} run {row['run_s']:6.2f} s  "
                          f"steps {row['step_s']:5.2f} s  overhead {row['overhead_s']:5.2f} s",
                          flush=True)
    print()
    print("| launcher | model | runs | median run s | median steps s | median overhead s | max overhead s |")
    print("|---|---|---|---|---|---|---|")
    for launcher in ("torchrun", "zygote"):
        for model in ("gpt2", "llama3", "all"):
            sel = [r for r in rows if r["launcher"] == launcher and model in (r["model"], "all")]
            print(f"| {launcher} | {model} | {len(sel)} | {median([r['run_s'] for r in sel]):.2f} | "
                  f"{median([r['step_s'] for r in sel]):.2f} | "
                  f"{median([r['overhead_s'] for r in sel]):.2f} | "
                  f"{max(r['overhead_s'] for r in sel):.2f} |")
    t = median([r["overhead_s"] for r in rows if r["launcher"] == "torchrun"])
    z = median([r["overhead_s"] for r in rows if r["launcher"] == "zygote"])
    print(f"\nmedian overhead per PP2 case: torchrun {t:.2f} s, zygote {z:.2f} s "
          f"({t / z:.1f}x less); zygote start {zygote_start_s:.2f} s once")
    print(machine())


if __name__ == "__main__":
    main()
