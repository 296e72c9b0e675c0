"""The false-failure rate of sessions on a correct build: per session and dtype, the cases run,
passed, failed and in error (every failure of a correct build is a false failure), the skipped
ones, and the scale-free thresholds each case was judged with (`record["calibration"]`: the
defaults, or a calibration file's).

    python benchmarks/verdict_matrix.py SESSION_DIR [SESSION_DIR ...] [--tablefmt github]

Typical use: a calibration session then a session that uses its file, same selection, same
output folder (docs/benchmarks.md#numerics):

    python -m pytest configs/test_config.json --gpus 4 -n 2 --harness-calibrate 3 --harness-output OUT
    python -m pytest configs/test_config.json --gpus 4 -n 2 --harness-output OUT
    python benchmarks/verdict_matrix.py OUT/sessions/*
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from tabulate import tabulate

from harness.contracts.records import RESULTS_NAME, read_jsonl

RUN = ("passed", "failed", "error")  # statuses of a case that ran (skipped: did not)


def read_records(session: Path) -> list[dict]:
    """The session's records, the last one of each case name (a retried case counts once)."""
    by_name: dict[str, dict] = {}
    for record in read_jsonl(Path(session) / RESULTS_NAME, missing_ok=False):
        if isinstance(record, dict) and "name" in record:
            by_name[record["name"]] = record
    return list(by_name.values())


def _thresholds(record: dict) -> str:
    cal = record.get("calibration") or {}
    th = cal.get("thresholds")
    if not th:
        return "-"
    return (f"grad {th['gradients']:.3g}, loss {th['loss']:.3g} "
            f"({'calibrated' if cal.get('file') else 'defaults'})")


def summarize(records: list[dict]) -> list[dict]:
    """One entry per dtype: counts by status, the threshold sets used (with how many cases
    each), the calibration files and problems named, the failing cases."""
    out = []
    dtypes = sorted({(r.get("flags") or {}).get("dtype") or "float32" for r in records})
    for dtype in dtypes:
        mine = [r for r in records if ((r.get("flags") or {}).get("dtype") or "float32") == dtype]
        status = Counter(r.get("status") for r in mine)
        ran = [r for r in mine if r.get("status") in RUN]
        thresholds = Counter(_thresholds(r) for r in ran)
        files = sorted({(r.get("calibration") or {}).get("file") for r in ran} - {None})
        problems = sorted({(r.get("calibration") or {}).get("problem") for r in ran} - {None})
        failing = sorted(r["name"] for r in ran if r.get("status") != "passed")
        out.append({"dtype": dtype, "ran": len(ran), "passed": status["passed"],
                    "failed": status["failed"], "error": status["error"],
                    "skipped": status["skipped"], "thresholds": dict(thresholds),
                    "files": files, "problems": problems, "failing": failing})
    return out


def rate(entry: dict) -> str:
    bad = entry["failed"] + entry["error"]
    return f"{bad}/{entry['ran']}" + (f" ({100 * bad / entry['ran']:.1f} %)" if entry["ran"] else "")


def rows(sessions: list[tuple[str, list[dict]]]) -> list[list]:
    out = []
    for name, records in sessions:
        for e in summarize(records):
            th = "; ".join(f"{k} x{v}" for k, v in sorted(e["thresholds"].items()))
            out.append([name, e["dtype"], e["ran"], e["passed"], e["failed"], e["error"],
                        rate(e), e["skipped"], th, ", ".join(e["failing"]) or "-"])
    return out


HEADERS = ["session", "dtype", "cases run", "passed", "failed", "error", "false failures",
           "skipped", "scale-free thresholds (cases)", "failing cases"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sessions", nargs="+", type=Path)
    p.add_argument("--tablefmt", default="simple")
    a = p.parse_args(argv)
    sessions = [(s.name, read_records(s)) for s in a.sessions]
    print(tabulate(rows(sessions), headers=HEADERS, tablefmt=a.tablefmt))
    for name, records in sessions:
        for e in summarize(records):
            for f in e["files"]:
                print(f"{name} {e['dtype']}: calibration file {f}")
            for problem in e["problems"]:
                print(f"{name} {e['dtype']}: calibration problem: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
