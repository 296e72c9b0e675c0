"""How long the gradient diff takes on a GPT-2 124M-shaped dump pair (issue 12 item 5: at most
1.5 s on the 2-core development machine).

    python benchmarks/diff_speed.py [--rounds 3] [--old] [--dir DIR]

Writes a synthetic pair (148 float32 .npy files per side, 124.4M elements, ~0.5 GB each: wte
50304x768, wpe 1024x768, 12 layers of width 768, ln_f) into a temporary folder, then times
`compare_gradients` with both verdicts, warm (the files in the page cache, as right after the
run wrote them). `--old` also times the previous implementation (np.load + float64 copy per
file), once. The folder is removed at the end unless --dir is given.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.cases import Tolerance
from harness.compare import compare_gradients
from harness.compare.diff import gradient_names
from harness.compare.fastdiff import exact_stats


def shapes_124m(layers: int = 12, width: int = 768, vocab: int = 50304, seq: int = 1024):
    yield "wte.weight", (vocab, width)
    yield "wpe.weight", (seq, width)
    for i in range(layers):
        p = f"h.{i}."
        yield p + "ln_1.weight", (width,)
        yield p + "ln_1.bias", (width,)
        yield p + "attn.c_attn.weight", (3 * width, width)
        yield p + "attn.c_attn.bias", (3 * width,)
        yield p + "attn.c_proj.weight", (width, width)
        yield p + "attn.c_proj.bias", (width,)
        yield p + "ln_2.weight", (width,)
        yield p + "ln_2.bias", (width,)
        yield p + "mlp.c_fc.weight", (4 * width, width)
        yield p + "mlp.c_fc.bias", (4 * width,)
        yield p + "mlp.c_proj.weight", (width, 4 * width)
        yield p + "mlp.c_proj.bias", (width,)
    yield "ln_f.weight", (width,)
    yield "ln_f.bias", (width,)


def write_pair(root: Path) -> int:
    rng = np.random.default_rng(0)
    (root / "ref").mkdir(parents=True, exist_ok=True)
    (root / "got").mkdir(parents=True, exist_ok=True)
    total = 0
    for name, shape in shapes_124m():
        ref = rng.standard_normal(shape, dtype=np.float32)
        ref *= np.float32(0.01)
        np.save(root / "ref" / f"{name}.npy", ref)
        noise = rng.standard_normal(shape, dtype=np.float32)
        noise *= np.float32(1e-7)
        noise += np.float32(1)
        ref *= noise  # reordering-level noise
        np.save(root / "got" / f"{name}.npy", ref)
        total += ref.size
    return total


def old_diff(got_dir: Path, ref_dir: Path, tol: Tolerance) -> None:
    for name in gradient_names(ref_dir):
        ref = np.load(ref_dir / f"{name}.npy").astype(np.float64)
        got = np.load(got_dir / f"{name}.npy").astype(np.float64)
        exact_stats(got, ref, tol.atol, tol.rtol)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", action="store_true", help="also time the float64 implementation")
    p.add_argument("--dir", default=None, help="keep the pair here (reused when present)")
    a = p.parse_args()
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="diff-speed-"))
    try:
        if not (root / "ref" / "ln_f.bias.npy").is_file():
            t = time.perf_counter()
            n = write_pair(root)
            print(f"wrote {n / 1e6:.1f}M elements per side in {time.perf_counter() - t:.1f} s")
        size = sum(f.stat().st_size for f in (root / "ref").glob("*.npy"))
        files = len(list((root / "ref").glob("*.npy")))
        print(f"{files} files, {size / 1e9:.2f} GB per side, in {root}")
        tol = Tolerance(1e-5, 0.0)
        compare_gradients(root / "got", root / "ref", tol, relative=1e-5)  # warm the page cache
        times = []
        for _ in range(a.rounds):
            t = time.perf_counter()
            diff = compare_gradients(root / "got", root / "ref", tol, relative=1e-5)
            times.append(time.perf_counter() - t)
        worst = diff.worst_relative
        print(f"compare_gradients (both verdicts): median {statistics.median(times):.2f} s, "
              f"min {min(times):.2f} s over {a.rounds} rounds; ok={diff.ok}, worst relative "
              f"error {worst.relative_error:.2e} ({worst.name})")
        if a.old:
            t = time.perf_counter()
            old_diff(root / "got", root / "ref", tol)
            print(f"previous implementation (np.load + float64 per file): "
                  f"{time.perf_counter() - t:.2f} s")
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
