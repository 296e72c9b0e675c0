"""Small helpers shared by the benchmark scripts: the machine line, medians, table printing.

Benchmarks are not tests: they print tables for docs/benchmarks.md and assert nothing.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def machine() -> str:
    """One line: CPU model, usable cores, 1/5/15-minute load averages (other users count)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model}, {cores} cores, load average {load}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def header(title: str) -> None:
    print(f"# {title}")
    print(f"# machine: {machine()}; commit {git_commit()}")
    sys.stdout.flush()
