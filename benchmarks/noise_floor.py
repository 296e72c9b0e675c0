"""The measured noise floor: both verdicts' statistics of every passing case of one or more
sessions, from the dumps they kept, grouped by dtype. What the scale-free thresholds
(harness/compare/verdict.py) are chosen from.

    python benchmarks/noise_floor.py SESSION_DIR [SESSION_DIR ...]

A session run with `--harness-keep-dumps all` (or from before dumps were removed) keeps every
case's gradients; the reference's are in the cache (the record's reference.path). Per case:
max |Δ| (element-wise), the worst ||Δ||/||ref|| and its parameter, the worst loss
|Δ|/max(|loss|, 1); per dtype the largest of each, and the margin of the default thresholds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabulate import tabulate

from harness.cases import Tolerance
from harness.compare import compare_gradients, compare_losses
from harness.compare.verdict import relative_thresholds


def case_noise(record: dict) -> dict | None:
    out, ref = record.get("output_dir"), (record.get("reference") or {}).get("path")
    if record.get("status") != "passed" or not out or not ref:
        return None
    got_dir, ref_dir = Path(out) / "gradients", Path(ref) / "gradients"
    if not got_dir.is_dir() or not ref_dir.is_dir():
        return None
    dtype = (record.get("flags") or {}).get("dtype", "float32")
    grads = compare_gradients(got_dir, ref_dir, Tolerance(1e-2), relative=1.0)
    worst = grads.worst_relative
    got = [{"step": i, "loss": v} for i, v in enumerate(record.get("losses") or [])]
    ref_losses = [{"step": i, "loss": v} for i, v in enumerate(record.get("reference_losses") or [])]
    loss = compare_losses(got, ref_losses, Tolerance(1.0), relative=1.0)
    return {"case": record["name"], "dtype": dtype, "grad_max_abs": grads.max_abs_diff,
            "grad_rel": worst.relative_error if worst else 0.0,
            "grad_rel_at": worst.name if worst else "-", "loss_abs": loss.max_abs_diff,
            "loss_rel": loss.worst_relative}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sessions", nargs="+")
    a = p.parse_args()
    rows = []
    for session in a.sessions:
        for line in (Path(session) / "results.jsonl").read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            row = case_noise(record)
            if row:
                rows.append(row)
    if not rows:
        print("no passing case with gradient dumps found", file=sys.stderr)
        return 1
    print(tabulate([[r["case"], r["dtype"], f"{r['grad_max_abs']:.3g}", f"{r['grad_rel']:.3g}",
                     r["grad_rel_at"], f"{r['loss_abs']:.3g}", f"{r['loss_rel']:.3g}"]
                    for r in rows],
                   headers=["case", "dtype", "grad max|Δ|", "grad max ‖Δ‖/‖ref‖", "at",
                            "loss max|Δ|", "loss max |Δ|/max(|loss|,1)"]))
    print()
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        th = relative_thresholds(dtype)
        g = max(r["grad_rel"] for r in mine)
        l = max(r["loss_rel"] for r in mine)
        print(f"{dtype}: {len(mine)} cases; worst grad ‖Δ‖/‖ref‖ {g:.3g} (threshold "
              f"{th.gradients:g}, margin {th.gradients / g if g else float('inf'):.3g}x); worst "
              f"loss rel {l:.3g} (threshold {th.loss:g}, margin "
              f"{th.loss / l if l else float('inf'):.3g}x); worst grad max|Δ| "
              f"{max(r['grad_max_abs'] for r in mine):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
