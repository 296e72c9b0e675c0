"""The history's numbers (issue 36, docs/benchmarks.md#history): this machine's night-to-night
tokens/s noise, how well `find_steps` finds a throughput step in series with that noise, and how
long `python -m harness.history` takes on a year of nights.

    python benchmarks/history_detection.py noise --sessions 10 --out DIR [-k EXPR]
    python benchmarks/history_detection.py detect --sigma S | --resample DIR [--series 1000]
    python benchmarks/history_detection.py render [--nights 365] [--cases 200]

noise: runs the same harness session (`configs/test_config.json -k EXPR --gpus 1`, the bundled
trainer) `--sessions` times into one output folder, as a nightly does, then reads the history
those sessions appended and prints each case's noise: the standard deviation of one night's
log tokens/s, by the estimator find_steps itself uses (`series_noise`), and the plain one.
With `--no-runs` it reads an output folder's history as it is.

detect: synthetic series with log-normal noise of that sigma, or with nights resampled from a
measured history (`--resample DIR`: every case's log tokens/s less its median, so a noise that
is not normal stays as it was measured). Detection: QUIET nights, then a
step of `--step` (a slowdown); the night the step is first named (find_steps over the nights
known by then, at its true first night) counted from the step's first night. False alarms:
30 quiet nights (as tests/history/test_findings.py), any step named anywhere. Both for a
range of STEP_Z, so the chosen one can be read against its neighbours; then, for comparison,
a rule made for a noise of rare slow nights (three nights in a row each at least X slower),
for a range of X: what a rule that knows the noise's shape finds at the same false alarms.

render: a history of `--nights` x `--cases` rows (4 tags x 2 models, statuses, margins,
tokens/s, memory) written as history.jsonl, then `python -m harness.history DIR` timed as a
user runs it (a fresh interpreter: imports, reading and validating every row, findings,
tables, one PNG per tag x model), and again with --no-plots.

Benchmarks are not tests: they print tables and assert nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import PYTHON, REPO, git_commit, machine  # noqa: E402

from harness.history import findings  # noqa: E402
from harness.history.rows import HistoryRow  # noqa: E402
from harness.history.store import (CACHE, append_rows, history_path,  # noqa: E402
                                   read_history)

QUIET = 20  # nights before a planted step
WITHIN = 3  # the bound: a step named within its first three nights
FALSE_ALARM_NIGHTS = 30
Z_VALUES = (2.5, 3.0, 3.5, 4.0, 4.5)


# --- noise ------------------------------------------------------------------------------------

def run_sessions(out: Path, sessions: int, expr: str) -> list[float]:
    """`sessions` harness sessions of the bundled trainer into `out`; their wall times."""
    walls = []
    for i in range(sessions):
        start = time.perf_counter()
        done = subprocess.run(
            [PYTHON, "-m", "pytest", "configs/test_config.json", "-k", expr, "--gpus", "1",
             "--harness-output", str(out), "-p", "no:cacheprovider", "-q"],
            cwd=REPO, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        print(f"session {i + 1}/{sessions}: exit {done.returncode}, {walls[-1]:.1f} s: {last}",
              flush=True)
    return walls


def passed_log_tokens(out: Path) -> dict[str, list[float]]:
    """Each case's log tokens/s over its passed nights, oldest first, from `out`'s history."""
    by_case: dict[str, list[float]] = {}
    for row in read_history(history_path(out)).rows:
        if row.tokens_per_s and math.isfinite(row.tokens_per_s) and row.status == "passed":
            by_case.setdefault(row.name, []).append(math.log(row.tokens_per_s))
    return by_case


def noise_table(out: Path) -> tuple[list[list], float]:
    """Per case: nights, mean tokens/s, the series noise (find_steps' estimator) and the plain
    standard deviation of log tokens/s; and the largest series noise."""
    table, worst = [], 0.0
    for name, logs in sorted(passed_log_tokens(out).items()):
        logs = np.asarray(logs)
        values = np.exp(logs)
        robust = findings.series_noise(logs)
        plain = float(np.std(logs, ddof=1)) if len(logs) > 1 else float("nan")
        worst = max(worst, robust)
        table.append([name, len(values), f"{np.mean(values):,.0f}", f"{robust:.4f}",
                      f"{plain:.4f}", f"{(values.max() / values.min() - 1):.1%}"])
    return table, worst


# --- detect -----------------------------------------------------------------------------------

def measured_pool(out: Path) -> np.ndarray:
    """Every passed night's log tokens/s less its case's median, over the cases of a
    history: the measured noise itself, to resample (it need not be normal: a shared VM's is
    bimodal)."""
    pool = [x - float(np.median(xs)) for xs in passed_log_tokens(out).values() if len(xs) > 1
            for x in xs]
    if not pool:
        raise SystemExit(f"{history_path(out)}: no case with two passed nights and tokens/s")
    return np.asarray(pool)


def series(rng: np.random.Generator, sigma: float | np.ndarray, nights: int,
           step_at: int | None, ratio: float) -> np.ndarray:
    """Quiet nights with normal log noise of `sigma`, or resampled from a measured pool."""
    noise = rng.choice(sigma, nights) if isinstance(sigma, np.ndarray) \
        else rng.normal(0.0, sigma, nights)
    values = 1000.0 * np.exp(noise)
    if step_at is not None:
        values[step_at:] *= ratio
    return values


def nights_to_find(values: np.ndarray, step_at: int, z: float) -> int | None:
    """On which of the step's nights (1 = its first) find_steps first names it at its night."""
    for seen in range(1, WITHIN + 1):
        found = findings.find_steps(list(values[:step_at + seen]), z_min=z)
        if any(s.index == step_at for s in found):
            return seen
    return None


def detection(sigma: float | np.ndarray, step: float, n: int, seed: int) -> list[list]:
    table = []
    for z in Z_VALUES:
        rng = np.random.default_rng(seed)
        nights = [nights_to_find(series(rng, sigma, QUIET + WITHIN, QUIET, 1 - step), QUIET, z)
                  for _ in range(n)]
        found = [k for k in nights if k is not None]
        rng = np.random.default_rng(seed + 1)
        alarms = sum(bool(findings.find_steps(list(series(rng, sigma, FALSE_ALARM_NIGHTS,
                                                           None, 1.0)), z_min=z))
                     for _ in range(n))
        by_night = [sum(1 for k in found if k <= d) / n for d in range(1, WITHIN + 1)]
        table.append([f"{z:g}" + (" (STEP_Z)" if z == findings.STEP_Z else ""),
                      *(f"{share:.1%}" for share in by_night),
                      f"{alarms / n * 100:.2f}"])
    return table


THRESHOLD_SHARES = (0.03, 0.035, 0.04, 0.045, 0.05)


def threshold_rule(sigma: float | np.ndarray, step: float, n: int, seed: int) -> list[list]:
    """For comparison with find_steps, a rule made for a noise of rare slow nights: a step at a
    night when it and the WITHIN - 1 nights after it are all at least X slower than the median
    of the (up to findings.BEFORE) nights before, find_steps' own window. Found: at the step's
    WITHIN-th night, in series as `detection` makes them; false alarms: any night of
    FALSE_ALARM_NIGHTS quiet ones (at least findings.MIN_BEFORE nights before it) where the
    rule holds. One row per X: how much a rule that knows the
    noise's shape can find at about one false alarm per 100 series (vectorized over series)."""
    table = []
    for share in THRESHOLD_SHARES:
        drop = math.log1p(-share)
        rng = np.random.default_rng(seed)
        stepped = np.log(np.stack([series(rng, sigma, QUIET + WITHIN, QUIET, 1 - step)
                                   for _ in range(n)]))
        base = np.median(stepped[:, QUIET - findings.BEFORE:QUIET], axis=1)
        found = np.all(stepped[:, QUIET:] <= (base + drop)[:, None], axis=1)
        rng = np.random.default_rng(seed + 1)
        quiet = np.log(np.stack([series(rng, sigma, FALSE_ALARM_NIGHTS, None, 1.0)
                                 for _ in range(n)]))
        alarm = np.zeros(n, dtype=bool)
        for t in range(findings.MIN_BEFORE, FALSE_ALARM_NIGHTS - WITHIN + 1):
            base = np.median(quiet[:, max(0, t - findings.BEFORE):t], axis=1)
            alarm |= np.all(quiet[:, t:t + WITHIN] <= (base + drop)[:, None], axis=1)
        table.append([f"{share:.1%}", f"{found.mean():.1%}", f"{alarm.mean() * 100:.2f}"])
    return table


# --- render -----------------------------------------------------------------------------------

def synthetic_history(out: Path, nights: int, cases: int, seed: int = 7) -> int:
    """A history.jsonl of nights x cases rows under out/history/."""
    rng = np.random.default_rng(seed)
    start = datetime(2025, 12, 4, 2, 17, tzinfo=timezone(timedelta(hours=8)))
    tags, models = ("basic", "pipeline", "tensor", "checkpoint"), ("gpt2", "llama3")
    names = [f"{tags[i % 4]}/{models[(i // 4) % 2]}/case{i:03d}" for i in range(cases)]
    base = {n: float(rng.uniform(500, 20000)) for n in names}
    path = history_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w") as f:
        for night in range(nights):
            date = (start + timedelta(days=night)).strftime("%Y-%m-%dT%H:%M:%S%z")
            session = f"2025{night:04d}-021700-{night}"
            commit = f"{night // 7:040x}"  # a build a week
            for i, name in enumerate(names):
                flaky = i % 50 == 0 and rng.random() < 0.1
                row = HistoryRow(
                    session=session, date=date, config="configs/test_config.json",
                    machine="a800-node3", trainer="infinitrain", build=commit[:12],
                    commit=commit, branch="master", name=name,
                    status="failed" if flaky else "passed", self_check="passed",
                    loss_margin=float(900 * math.exp(rng.normal(0, 0.1))),
                    gradient_margin=float(150 * math.exp(rng.normal(0, 0.1))),
                    last_loss=float(5.0 - 0.001 * night), last_step=10,
                    tokens_per_s=float(base[name] * math.exp(rng.normal(0, 0.02))),
                    tokens_per_s_spread=0.01, step_ms=float(1e6 / base[name]),
                    peak_memory_mb=float(4000 + rng.normal(0, 5)))
                f.write(json.dumps(row.to_json()) + "\n")
                written += 1
    (out / "sessions").mkdir(exist_ok=True)
    return written


def timed_cli(out: Path, *extra: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([PYTHON, "-m", "harness.history", str(out), *extra], cwd=REPO,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"python -m harness.history {out} {' '.join(extra)}: exit "
                         f"{done.returncode}: {done.stderr.strip()[-500:]}")
    return wall, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def render_table(out: Path, cases: int, repeats: int) -> list[list]:
    """The CLI timed in the three situations a history is rendered in: the first read (no
    cache of the rows beside the history: a history copied in, or a Python upgrade), the
    nightly (the rows of every night before cached by the previous render, the night's
    `cases` rows appended since), and a render again with nothing new."""
    path = history_path(out)
    cache = path.with_name(CACHE)
    lines = path.read_bytes().splitlines(keepends=True)
    before, night = b"".join(lines[:-cases]), b"".join(lines[-cases:])

    def first() -> None:
        cache.unlink(missing_ok=True)

    def nightly() -> None:
        path.write_bytes(before)
        cache.unlink(missing_ok=True)
        timed_cli(out, "--no-plots")  # last night's render: it leaves the cache
        path.write_bytes(before + night)  # tonight's sessions append their rows

    table = []
    for situation, setup in (("first read (no cache)", first),
                             ("the nightly (one night appended)", nightly),
                             ("again (nothing new)", lambda: None)):
        for label, extra in (("with plots", ()), ("--no-plots", ("--no-plots",))):
            walls = []
            for _ in range(repeats):
                setup()
                wall, said = timed_cli(out, *extra)
                walls.append(wall)
            pngs = len(list((out / "history").glob("*.png")))
            table.append([situation, label, f"{min(walls):.2f}", f"{np.median(walls):.2f}",
                          f"{max(walls):.2f}", pngs if not extra else "", said])
    return table


def append_table(out: Path, cases: int, repeats: int) -> list[list]:
    """A session's finish: its `cases` rows appended to the year (append_rows, in process, as
    the plugin calls it), after the previous night's render left its cache, and with no
    cache. The history is restored after each."""
    path = history_path(out)
    cache = path.with_name(CACHE)
    data = path.read_bytes()
    tonight = [dataclasses.replace(r, session=r.session + "-tonight")
               for r in read_history(path).rows[-cases:]]  # the read leaves the cache
    kept = cache.read_bytes()
    table = []
    for situation, cached in (("after the last render (its cache)", True), ("no cache", False)):
        walls = []
        for _ in range(repeats):
            path.write_bytes(data)
            if cached:
                cache.write_bytes(kept)
            else:
                cache.unlink(missing_ok=True)
            start = time.perf_counter()
            added = append_rows(path, tonight)
            walls.append(time.perf_counter() - start)
        table.append([situation, added, f"{min(walls):.2f}", f"{np.median(walls):.2f}",
                      f"{max(walls):.2f}"])
    path.write_bytes(data)
    cache.write_bytes(kept)
    return table


# --- command line -----------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    n = sub.add_parser("noise", help="this machine's night-to-night tokens/s noise")
    n.add_argument("--out", type=Path, required=True, help="the sessions' output folder")
    n.add_argument("--sessions", type=int, default=10)
    n.add_argument("-k", dest="expr", default="basic and single")
    n.add_argument("--no-runs", action="store_true", help="read --out's history as it is")
    d = sub.add_parser("detect", help="find_steps on synthetic series of that noise")
    noise = d.add_mutually_exclusive_group(required=True)
    noise.add_argument("--sigma", type=float, help="log tokens/s noise of a night (normal)")
    noise.add_argument("--resample", type=Path, metavar="DIR",
                       help="resample the nights of DIR's history (each case's log tokens/s "
                            "less its median), e.g. the output folder of `noise`")
    d.add_argument("--step", type=float, default=0.05, help="the slowdown planted (share)")
    d.add_argument("--series", type=int, default=1000, help="series per row and kind")
    d.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("render", help="python -m harness.history on a synthetic year")
    r.add_argument("--nights", type=int, default=365)
    r.add_argument("--cases", type=int, default=200)
    r.add_argument("--repeats", type=int, default=3)
    for s in (n, d, r):
        s.add_argument("--tablefmt", default="github")
    args = p.parse_args(argv)
    for name in ("sessions", "series", "nights", "cases", "repeats"):
        if getattr(args, name, 1) < 1:
            p.error(f"--{name} {getattr(args, name)}: expected at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"machine: {machine()}; harness {git_commit()}")
    if args.command == "noise":
        if not args.no_runs:
            walls = run_sessions(args.out, args.sessions, args.expr)
            print(f"{len(walls)} sessions, {sum(walls):.0f} s")
        table, worst = noise_table(args.out)
        print(tabulate(table, headers=["case", "nights", "mean tokens/s", "series noise (log)",
                                       "plain sd (log)", "max/min - 1"], tablefmt=args.tablefmt))
        print(f"largest series noise: {worst:.4f}")
    elif args.command == "detect":
        noise = measured_pool(args.resample) if args.resample else args.sigma
        said = (f"noise resampled from {len(noise)} measured nights of {args.resample}"
                if args.resample else f"sigma {args.sigma:g} (log)")
        print(f"{said}, a {args.step:.0%} slowdown after {QUIET} quiet "
              f"nights; {args.series} series each; false alarms: {FALSE_ALARM_NIGHTS} quiet "
              f"nights, per 100 series")
        headers = ["STEP_Z", *(f"found by night {d}" for d in range(1, WITHIN + 1)),
                   "false alarms / 100"]
        print(tabulate(detection(noise, args.step, args.series, args.seed),
                       headers=headers, tablefmt=args.tablefmt))
        print(f"for comparison: a step called when {WITHIN} nights in a row are each at least X "
              "slower than the median of the nights before")
        print(tabulate(threshold_rule(noise, args.step, args.series, args.seed),
                       headers=["X", f"found by night {WITHIN}", "false alarms / 100"],
                       tablefmt=args.tablefmt))
    else:
        with tempfile.TemporaryDirectory(prefix="history-render-") as tmp:
            out = Path(tmp)
            rows = synthetic_history(out, args.nights, args.cases)
            size = history_path(out).stat().st_size / 2 ** 20
            print(f"{rows:,} rows ({args.nights} nights x {args.cases} cases), "
                  f"history.jsonl {size:.1f} MiB")
            print(tabulate(render_table(out, args.cases, args.repeats),
                           headers=["situation", "python -m harness.history", "min s",
                                    "median s", "max s", "PNGs", "its last line"],
                           tablefmt=args.tablefmt))
            print(tabulate(append_table(out, args.cases, args.repeats),
                           headers=["a session's append", "rows added", "min s", "median s",
                                    "max s"], tablefmt=args.tablefmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
