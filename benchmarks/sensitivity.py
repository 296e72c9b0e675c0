"""Which verdict catches which planted bug, next to the measured noise floor (issue 12 item 2).

    python benchmarks/sensitivity.py SESSION_DIR [--case basic/gpt2/pp2] [--no-runs]

SESSION_DIR is a session whose passing cases kept their gradient dumps (run with
`--harness-keep-dumps all`). From the chosen pipeline case and its single-device reference:

- noise: the case as it ran (a correct parallel run: another rounding order);
- stage scaling 1e-3 / 1e-4 / 1e-5: every gradient the case's layout puts on the last stage
  scaled by (1 + e), on the case's own dump;
- dropped microbatch: the reference trainer run with one microbatch fewer (total batch minus
  batch x sequence), its gradients and step-1 loss scaled by (n - 1) / n: what a loop that skips
  one microbatch but still divides by n computes (first step only);
- wrong norm eps: the reference trainer run with GPT-2's LayerNorm eps 1e-6 instead of 1e-5
  (in-process patch of harness.trainer.models.gpt2.LAYER_NORM_EPS).

Each probe is judged with the case dtype's defaults: element-wise atol (InfiniTrain's) and the
scale-free thresholds (harness/compare/verdict.py). `--no-runs` skips the two trainer runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from tabulate import tabulate

from harness.cases import Tolerance
from harness.compare import Locator, compare_gradients, compare_losses
from harness.compare.verdict import relative_thresholds

DEFAULT_ATOL = {"float32": 1e-5, "bfloat16": 1e-2}


def judge(label, got_dir, ref_dir, got_losses, ref_losses, dtype, locator):
    tol = Tolerance(DEFAULT_ATOL[dtype])
    rel = relative_thresholds(dtype)
    g = compare_gradients(got_dir, ref_dir, tol, locator, relative=rel.gradients)
    loss = compare_losses(got_losses, ref_losses, tol, relative=rel.loss)
    worst = g.worst_relative
    return [label, f"{g.max_abs_diff:.3g}", "caught" if not g.elementwise_ok else "missed",
            f"{worst.relative_error:.3g} ({worst.name})",
            "caught" if not g.relative_ok else "missed", f"{loss.max_abs_diff:.3g}",
            "caught" if not loss.elementwise_ok else "missed", f"{loss.worst_relative:.3g}",
            "caught" if not loss.relative_ok else "missed"]


def steps(values, first=1):
    return [{"step": first + i, "loss": v} for i, v in enumerate(values)]


def trainer_run(argv: list[str], out: Path, eps: float | None = None) -> list[float]:
    out.mkdir(parents=True, exist_ok=True)
    args = [a for a in argv if not a.startswith(("--output_dir=", "--dump_gradients="))]
    args += [f"--output_dir={out}", f"--dump_gradients={out / 'gradients'}"]
    patch = (f"import harness.trainer.models.gpt2 as m; m.LAYER_NORM_EPS = {eps!r}; "
             if eps is not None else "")
    code = (f"import sys; {patch}from harness.trainer.main import main; "
            f"sys.exit(main({args!r}))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    lines = (out / "steps.jsonl").read_text().splitlines()
    return [float(json.loads(line)["loss"]) for line in lines if line.strip()]


def scale_files(src: Path, dst: Path, names: set[str], factor: float) -> None:
    shutil.copytree(src, dst)
    for name in names:
        a = np.load(dst / f"{name}.npy")
        np.save(dst / f"{name}.npy", (a * np.float32(factor)).astype(np.float32))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("session")
    p.add_argument("--case", default="basic/gpt2/pp2")
    p.add_argument("--no-runs", action="store_true")
    a = p.parse_args()
    records = {}
    for line in (Path(a.session) / "results.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
            records[r["name"]] = r
        except (ValueError, KeyError):
            continue
    r = records[a.case]
    dtype = r["flags"]["dtype"]
    got_dir = Path(r["output_dir"]) / "gradients"
    ref_path = Path(r["reference"]["path"])
    ref_dir = ref_path / "gradients"
    if not got_dir.is_dir():
        print(f"{got_dir} is gone: run the session with --harness-keep-dumps all", file=sys.stderr)
        return 1
    locator = Locator.from_layout(r["layout"], r["model"])
    last = r["layout"]["chunks"][-1][0]
    names = {p.name[:-4] for p in ref_dir.glob("*.npy")}
    on_last = {n for n in names if last in locator.stages(n)}
    ref_losses = steps(r["reference_losses"])
    got_losses = steps(r["losses"])
    rows = [judge("noise (the case as it ran)", got_dir, ref_dir, got_losses, ref_losses, dtype,
                  locator)]
    tmp = Path(tempfile.mkdtemp(prefix="sensitivity-"))
    try:
        for e in (1e-3, 1e-4, 1e-5):
            dst = tmp / f"scaled-{e:g}"
            scale_files(got_dir, dst, on_last, 1 + e)
            rows.append(judge(f"stage {last} gradients x (1 + {e:g}) ({len(on_last)} params)",
                              dst, ref_dir, got_losses, ref_losses, dtype, locator))
        if not a.no_runs:
            argv = r["reference"]["command"]
            argv = argv[argv.index("harness.trainer") + 1:]
            flags = dict(f.split("=", 1) for f in argv if "=" in f)
            micro = int(flags["--batch_size"]) * int(flags["--sequence_length"])
            n = int(flags["--total_batch_size"]) // micro
            fewer = [f for f in argv if not f.startswith("--total_batch_size=")]
            fewer.append(f"--total_batch_size={(n - 1) * micro}")
            losses = trainer_run(fewer, tmp / "dropped")
            dropped = tmp / "dropped-scaled"
            scale_files(tmp / "dropped" / "gradients", dropped, names, (n - 1) / n)
            rows.append(judge(f"dropped microbatch (1 of {n}, step 1)", dropped, ref_dir,
                              steps([losses[0] * (n - 1) / n]), ref_losses[:1], dtype, locator))
            if r["model"] == "gpt2":
                losses = trainer_run(argv, tmp / "eps", eps=1e-6)
                rows.append(judge("LayerNorm eps 1e-6 instead of 1e-5", tmp / "eps" / "gradients",
                                  ref_dir, steps(losses), ref_losses, dtype, locator))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rel = relative_thresholds(dtype)
    print(f"case {a.case} ({dtype}); element-wise atol {DEFAULT_ATOL[dtype]:g}; scale-free "
          f"thresholds: gradients {rel.gradients:g}, loss {rel.loss:g}")
    print(tabulate(rows, headers=["probe", "grad max|Δ|", "element-wise", "grad max ‖Δ‖/‖ref‖",
                                  "scale-free", "loss max|Δ|", "element-wise",
                                  "loss max |Δ|/max(|loss|,1)", "scale-free"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
