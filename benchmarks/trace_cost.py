"""What a module-level trace costs: one step of a trainer without and with
`--precision_check "level=1,save_tensors=true"`, wall time and the trace's size on disk (the
peak: the trainer writes every tensor before the harness reads one).

    python benchmarks/trace_cost.py gpt2 CHECKPOINT TOKENS [--binary PATH] [--batch 4 --seq 64]

Without --binary it runs the bundled trainer (`python -m harness.trainer`); with it, that
InfiniTrain binary (`gpt2` / `llama3`) on CPU. Prints one line per run and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def folder_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*.npy") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def run(argv: list[str], cwd: Path) -> float:
    started = time.time()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=("gpt2", "llama3"))
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("tokens", type=Path)
    parser.add_argument("--binary", type=Path, help="an InfiniTrain binary (default: bundled)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    flags = [f"--input_bin={args.tokens.resolve()}", f"--llmc_filepath={args.checkpoint.resolve()}",
             "--num_iteration=1", f"--batch_size={args.batch}", f"--sequence_length={args.seq}",
             f"--total_batch_size={args.batch * args.seq}", "--device=cpu"]
    if args.binary is not None:
        base = [str(args.binary.resolve()), *flags]
        trainer = f"InfiniTrain {args.binary.name}"
    else:
        base = [sys.executable, "-m", "harness.trainer", f"--model={args.model}", *flags]
        trainer = "bundled"
    summary: dict = {"trainer": trainer, "model": args.model, "batch": args.batch,
                     "seq": args.seq, "without_s": [], "with_s": []}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for _ in range(args.repeats):
            out = scratch / "plain"
            out.mkdir(exist_ok=True)
            summary["without_s"].append(round(run(
                base + ([f"--output_dir={out}"] if args.binary is None else []), out), 2))
            trace = scratch / "trace"
            shutil.rmtree(trace, ignore_errors=True)
            trace.mkdir()
            summary["with_s"].append(round(run(
                base + ([f"--output_dir={trace}"] if args.binary is None else [])
                + [f"--precision_check=level=1,save_tensors=true,path={trace / 'dump'}"],
                trace), 2))
            summary["trace_bytes"], summary["tensors"] = folder_bytes(trace / "dump")
    best_without, best_with = min(summary["without_s"]), min(summary["with_s"])
    summary["ratio"] = round(best_with / best_without, 2)
    print(f"{trainer} {args.model} batch {args.batch} x {args.seq}: one step {best_without} s, "
          f"traced {best_with} s ({summary['ratio']}x), {summary['tensors']} tensors, "
          f"{summary['trace_bytes'] / 1e6:.0f} MB on disk")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
