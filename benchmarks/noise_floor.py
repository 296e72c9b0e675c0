"""The measured noise floor: both verdicts' statistics of every passing case of one or more
sessions, from the dumps they kept, grouped by dtype. What the scale-free thresholds
(harness/compare/verdict.py) are chosen from.

    python benchmarks/noise_floor.py SESSION_DIR [SESSION_DIR ...] [--calibration FILE ...]

A session run with `--harness-keep-dumps all` (or from before dumps were removed) keeps every
case's gradients; the reference's are in the cache (the record's reference.path). Per case:
max |Δ| (element-wise), the worst ||Δ||/||ref|| and its parameter, the worst loss
|Δ|/max(|loss|, 1); per dtype the largest of each, and the margin (threshold / worst) of the
default thresholds, of the thresholds the records say judged them (`record["calibration"]`)
and, per `--calibration FILE` of that dtype, of the thresholds a session takes from it
(harness.compare.calibration.calibrated_thresholds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabulate import tabulate

from harness.cases import Tolerance
from harness.compare import compare_gradients, compare_losses
from harness.compare.calibration import Calibration, calibrated_thresholds
from harness.compare.verdict import margin, relative_thresholds
from harness.contracts.records import RESULTS_NAME, read_jsonl


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
            "loss_rel": loss.worst_relative,
            "thresholds": ((record.get("calibration") or {}).get("thresholds") or None),
            "calibration_file": (record.get("calibration") or {}).get("file")}


def _x(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.3g}x"


def margin_lines(rows: list[dict], calibrations: list[Calibration] = ()) -> list[str]:
    """Per dtype: the worst of each statistic, and the margin of each threshold set."""
    out = []
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        g = max(r["grad_rel"] for r in mine)
        l = max(r["loss_rel"] for r in mine)
        at = max(mine, key=lambda r: r["grad_rel"])
        out.append(f"{dtype}: {len(mine)} cases; worst grad ‖Δ‖/‖ref‖ {g:.3g} ({at['case']}, "
                   f"{at['grad_rel_at']}); worst loss rel {l:.3g}; worst grad max|Δ| "
                   f"{max(r['grad_max_abs'] for r in mine):.3g}")
        sets = [("default", relative_thresholds(dtype).to_dict())]
        used = sorted({(r["calibration_file"] or "defaults", json.dumps(r["thresholds"],
                                                                          sort_keys=True))
                       for r in mine if r["thresholds"]})
        sets += [(f"as recorded ({file})", json.loads(th)) for file, th in used]
        for cal in calibrations:
            if cal.dtype == dtype:
                th, _ = calibrated_thresholds(relative_thresholds(dtype), cal)
                sets.append((f"calibrated ({cal.path})", th.to_dict()))
        for label, th in sets:
            out.append(f"  {label}: gradients {th['gradients']:.3g} (margin "
                       f"{_x(margin(th['gradients'], g))}), loss {th['loss']:.3g} (margin "
                       f"{_x(margin(th['loss'], l))})")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sessions", nargs="+")
    p.add_argument("--calibration", action="append", default=[], metavar="FILE",
                   help="a calibration file: also the margins of the thresholds taken from it")
    a = p.parse_args()
    rows = []
    for session in a.sessions:
        for record in read_jsonl(Path(session) / RESULTS_NAME, missing_ok=False):
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
    for line in margin_lines(rows, [Calibration.read(c) for c in a.calibration]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
