"""The GPU check: every config case that fits the GPUs, under both launchers, the CUDA run
against the CPU reference of the same key, and the throughput benchmark; one summary file.

    benchmarks/gpu_check.sh                        # on a CUDA machine (263 s on one H200)
    benchmarks/gpu_check.sh --quick --out DIR      # the basic tag only, a shorter benchmark
    benchmarks/gpu_check.sh --device cpu -k "gpt2 and single"   # the CPU dry-run (tests)

Parts, each a subprocess with its own time budget (killed with all its descendants past it;
the summary says so and the next part runs):

1. environment: GPU count, model, memory, driver (nvidia-smi), torch, CUDA, cuDNN, NCCL.
2. matrix/<launcher> for torchrun and zygote: `pytest <config> --harness-device cuda --gpus N
   --harness-launcher L`; cases needing more than N devices are skipped by the harness (with the
   reason), so "every case that fits" is what runs: float32 and bfloat16 cases alike. Both
   sessions share one reference cache, so the second reuses the first's references.
3. cross_device: a derived config of one single-device case per (model, dtype of the config)
   (`cross_device/<model>/single-<dtype>`), run once with `--harness-device cpu` and once with
   `--harness-device cuda` (`--harness-keep-dumps all`); then the CUDA run's losses and gradient
   files are compared with `harness.compare` against the CPU session's reference entry (the CPU
   reference of the same key: the keys are checked equal but for `device`), with the config's
   per-dtype atol / rtol and the scale-free thresholds of `harness.compare.verdict`.
4. throughput: `benchmarks/trainer_throughput.py --device cuda` (trainer against a plain loop),
   a short setting.

The summary, `<out>/gpu_check_summary.json` (format `harness.gpu_check/1`), holds every case's
per-step losses (run and reference), step times, diffs and timings, the pass / fail counts, the
environment, every part's budget and wall time, and the same summary as a markdown table (key
`markdown`; also written to `gpu_check_summary.md`). It is rewritten after every part, with
`complete: false` until the end, so a check killed from outside still leaves one.

`--device cpu` (or GPU_CHECK_DEVICE=cpu) is the dry-run: the same code paths with
`--harness-device cpu` and gloo, `--gpus` (default 1) virtual devices; the two sides of the
cross-device check are then both CPU (identical results expected). tests/benchmarks/
test_gpu_check.py runs it on a tiny selection.

Exit code: 0 when every check passed and no part ran out of time, 1 otherwise, 2 when the
device asked for is not there (the summary says why).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.compare.render import MARKDOWN, table  # noqa: E402
from harness.launch.process import end, start, tail  # noqa: E402
from harness.results.reading import NoResults, latest_results, read_session  # noqa: E402
from harness.contracts.records import STEPS_NAME, read_json, read_jsonl  # noqa: E402

FORMAT = "harness.gpu_check/1"
LAUNCHERS = ("torchrun", "zygote")
SUMMARY = "gpu_check_summary"
# Seconds per part on one GPU, from the first run on one (an H200, docs/benchmarks.md#gpu-check)
# with about 1.5x headroom: a single-device case there costs 17-21 s, mostly process start-up and
# the CUDA libraries' import. On more GPUs the matrix parts grow with the cases that fit
# (MATRIX_PER_CASE_S per extra case, divided by the xdist workers).
BUDGETS = {
    "environment": 20,
    "matrix/torchrun": 70,
    "matrix/zygote": 40,
    "cross_device/cpu": 130,
    "cross_device/device": 100,
    "throughput": 110,
}
MATRIX_PER_CASE_S = 20


# ----------------------------------------------------------------------------- processes

def run_part(summary: dict, name: str, argv: list[str], budget_s: float, log: Path,
             env: dict | None = None) -> dict:
    """Run argv with a time budget; its output goes to log. Recorded in summary['parts'].
    Past the budget, or on any way out (an interrupt, SIGTERM from the wrapper), the part is
    ended with every process it started (harness.launch.process: torchrun and the zygote put
    their ranks in sessions of their own, which the reaper still reaches)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    part = {"name": name, "command": shlex.join(argv), "budget_s": round(budget_s, 1),
            "log": str(log), "returncode": None, "timed_out": False, "wall_s": None}
    summary["parts"].append(part)
    started = time.time()
    with open(log, "w") as out:
        process = start(argv, env or os.environ.copy(), out, subprocess.STDOUT, cwd=REPO)
        try:
            part["returncode"] = process.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            part["timed_out"] = True
        finally:  # every way out: leave nothing behind
            returncode = end(process)
    if part["timed_out"]:
        part["returncode"] = returncode
    part["wall_s"] = round(time.time() - started, 2)
    print(f"  {name}: {'TIMED OUT' if part['timed_out'] else 'rc ' + str(part['returncode'])} "
          f"in {part['wall_s']:.1f} s (budget {budget_s:.0f} s); log {log}", flush=True)
    return part


def log_tail(path: str | Path, lines: int = 15) -> str:
    return tail(Path(path), lines)


# ----------------------------------------------------------------------------- environment

PROBE = r"""
import json, platform, socket, sys
import torch
d = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
     "platform": platform.platform(), "host": socket.gethostname(), "gpu_count": 0, "gpus": [],
     "cudnn": None, "nccl": None, "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    d["gpu_count"] = torch.cuda.device_count()
    for i in range(d["gpu_count"]):
        p = torch.cuda.get_device_properties(i)
        d["gpus"].append({"index": i, "name": p.name, "memory_mb": p.total_memory // 2**20,
                          "capability": f"{p.major}.{p.minor}"})
    d["cudnn"] = torch.backends.cudnn.version()
    try:
        v = torch.cuda.nccl.version()
        d["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:
        d["nccl"] = f"unknown ({type(e).__name__})"
json.dump(d, open(sys.argv[1], "w"))
"""


def probe_environment(summary: dict, out: Path) -> dict:
    log, found = out / "logs" / "environment.log", out / "environment.json"
    found.unlink(missing_ok=True)  # a rerun into the same folder must not read an old probe
    part = run_part(summary, "environment", [sys.executable, "-c", PROBE, str(found)],
                    summary["budgets"]["environment"], log)
    env: dict = {"python": platform.python_version(), "host": socket.gethostname()}
    env.update(read_json(found) or {})
    part["ok"] = "torch" in env
    env["driver"] = None
    env["nvidia_smi"] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        if smi.returncode == 0:
            rows = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
            env["nvidia_smi"] = rows
            drivers = sorted({r.split(",")[1].strip() for r in rows if r.count(",") >= 2})
            env["driver"] = ", ".join(drivers) or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, text=True,
                                           capture_output=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        env["git_commit"] = None
    env["cpu"] = _cpu_model()
    env["cpu_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------- plan

def plan_cases(config_path: Path, gpus: int) -> dict:
    """What the config holds and what fits `gpus` devices (before -k / -m selection)."""
    from harness.cases import load_config

    config = load_config(config_path)
    cases = config.cases
    fit = [c for c in cases if c.world_size <= gpus and c.reference_world_size <= gpus]
    dtypes = []
    for c in cases:
        dtype = c.flags.get("dtype") or "float32"
        if dtype not in dtypes:
            dtypes.append(dtype)
    return {"total": len(cases), "fit": len(fit), "fit_names": [c.name for c in fit],
            "fit_single_device": sum(1 for c in fit if c.world_size == 1),
            "dtypes": dtypes, "models": list(config.models),
            "fit_by_dtype": {d: sum(1 for c in fit if (c.flags.get("dtype") or "float32") == d)
                             for d in dtypes}}


def cross_device_config(config_path: Path, dtypes: list[str], out: Path) -> Path:
    """The config with one group: a single-device case per dtype (the reference key of every
    case of that dtype whose reference is one device)."""
    data = json.loads(config_path.read_text())
    data.pop("$schema", None)
    derived = copy.deepcopy(data)
    derived["description"] = (f"gpu_check: single-device cases of {config_path} per dtype, "
                              "run on CPU and on the device")
    derived["test_groups"] = [{
        "tag": "cross_device",
        "description": "the device's single-device run against the CPU reference of the key",
        "tests": [{"id": f"single-{d}", "description": f"one device, {d}", "args": {"dtype": d}}
                  for d in dtypes],
    }]
    # Paths in a config are relative to its folder; the derived one lives elsewhere, so the
    # file paths are made absolute (@VAR@ paths in `variables` are not: the bundled config
    # has none, and this check is for the bundled trainer).
    base = config_path.parent

    def absolute(text):
        return text if not isinstance(text, str) or "@" in text or Path(text).is_absolute() \
            else str((base / text).resolve())

    for spec in (derived.get("model_files") or {}).values():
        for role in ("checkpoint", "input_bin"):
            if role in spec:
                spec[role] = absolute(spec[role])
    if isinstance(derived.get("assets"), dict) and "dir" in derived["assets"]:
        derived["assets"]["dir"] = absolute(derived["assets"]["dir"])
    if isinstance(derived.get("trainer"), dict) and "build" in derived["trainer"]:
        derived["trainer"]["build"] = absolute(derived["trainer"]["build"])
    path = out / "cross_device" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(derived, indent=1) + "\n")
    return path


# ----------------------------------------------------------------------------- sessions

def pytest_argv(config: Path, device: str, gpus: int, launcher: str, output: Path, cache: Path,
                select: str | None, marker: str | None, run_timeout_s: float, workers: int,
                extra: list[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "pytest", str(config), "--harness-config", str(config),
            "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
            "--harness-device", device, "--gpus", str(gpus), "--harness-launcher", launcher,
            "--harness-output", str(output), "--harness-reference-cache", str(cache),
            "--harness-timeout", str(int(run_timeout_s)), "-p", "no:cacheprovider", "-q",
            "-o", "console_output_style=classic", *extra]
    if select:
        argv += ["-k", select]
    if marker:
        argv += ["-m", marker]
    if workers > 1:
        argv += ["-n", str(workers)]
    return argv


def session_records(output: Path) -> tuple[list[dict], dict | None, str | None]:
    """The records and header of the latest session under output/sessions (the report's
    reader: a line cut short by a kill is left out, a rerun case's last record counts)."""
    try:
        results = latest_results(output)
    except NoResults:
        return [], None, None
    session = read_session([results])
    return session.records, session.header or None, str(results.parent)


def _num(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def case_row(record: dict, launcher: str) -> dict:
    loss = record.get("loss") or {}
    grads = record.get("gradients") or {}
    env = record.get("environment") or {}
    return {
        "launcher": launcher, "name": record.get("name"), "tag": record.get("tag"),
        "model": record.get("model"), "case_id": record.get("case_id"),
        "dtype": (record.get("flags") or {}).get("dtype") or "float32",
        "world_size": record.get("world_size"), "status": record.get("status"),
        "reason": record.get("reason"), "device": record.get("device"),
        "device_name": env.get("device_name"),
        "loss_max_abs_diff": _num(loss.get("max_abs_diff")),
        "loss_relative_worst": _num((loss.get("relative") or {}).get("worst")),
        "grad_max_abs_diff": _num(grads.get("max_abs_diff")),
        "grad_relative_worst": _num((grads.get("relative") or {}).get("worst")),
        "grad_parameters": grads.get("parameters"),
        "tolerances": record.get("tolerances"),
        "losses": record.get("losses"), "reference_losses": record.get("reference_losses"),
        "step_times_ms": record.get("step_times_ms"), "tokens_per_s": record.get("tokens_per_s"),
        "peak_memory_mb": record.get("peak_memory_mb"), "timings": record.get("timings"),
        "failing_rank": record.get("failing_rank"), "output_dir": record.get("output_dir"),
    }


def count(statuses) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for status in statuses:
        counts[status if status in counts else "error"] += 1
    counts["total"] = sum(counts.values())
    return counts


def run_matrix(summary: dict, a, out: Path, cache: Path) -> None:
    matrix = summary["matrix"]
    for launcher in a.launchers:
        name = f"matrix/{launcher}"
        output = out / "matrix" / launcher
        budget = summary["budgets"][name]
        argv = pytest_argv(a.config, a.device, a.gpus, launcher, output, cache, a.select,
                           a.marker, budget, a.workers)
        part = run_part(summary, name, argv, budget, out / "logs" / f"matrix-{launcher}.log")
        records, header, folder = session_records(output)
        rows = [case_row(r, launcher) for r in records]
        collected = (header or {}).get("collected") or []
        have = {r["name"] for r in rows}
        missing = [n for n in collected if n not in have]
        for n in missing:  # collected, never finished (the part ran out of time, or crashed)
            rows.append({"launcher": launcher, "name": n, "status": "error",
                         "reason": "no record: the session ended before this case finished"
                         + (" (part timed out)" if part["timed_out"] else "")})
        matrix["cases"].extend(rows)
        part["session"] = folder
        part["counts"] = count(r["status"] for r in rows)
        # pytest: 0 all passed, 1 some failed, 5 nothing collected (a -k outside the matrix)
        part["ok"] = (not part["timed_out"] and part["returncode"] in (0, 5)
                      and not part["counts"]["failed"] and not part["counts"]["error"])
        if not part["ok"] and not rows:
            part["log_tail"] = log_tail(part["log"])
        matrix["counts"][launcher] = part["counts"]
        write_summary(summary, out)
    matrix["launchers_agree"] = launcher_agreement(matrix["cases"], a.launchers)


def launcher_agreement(rows: list[dict], launchers) -> dict:
    """Per case run under both launchers: are the per-step losses the same bit for bit (they
    are on CPU; on CUDA a non-deterministic kernel may move them)? Information, not a verdict."""
    if len(launchers) < 2:
        return {"compared": 0, "identical": 0, "cases": []}
    first, second = launchers[0], launchers[1]
    by = {(r["launcher"], r["name"]): r for r in rows}
    cases = []
    for (launcher, name), r in sorted(by.items(), key=lambda kv: str(kv[0])):
        other = by.get((second, name))
        if launcher != first or other is None:
            continue
        a_l, b_l = r.get("losses"), other.get("losses")
        if not a_l or not b_l or r.get("status") != "passed" or other.get("status") != "passed":
            continue
        diff = max((abs(x - y) for x, y in zip(a_l, b_l)), default=0.0) \
            if len(a_l) == len(b_l) else math.inf
        cases.append({"name": name, "identical": a_l == b_l, "max_abs_diff": diff})
    return {"compared": len(cases), "identical": sum(c["identical"] for c in cases),
            "cases": cases}


# ----------------------------------------------------------------------------- cross-device

def read_steps(folder: Path) -> list[dict]:
    return read_jsonl(folder / STEPS_NAME)


def run_cross_device(summary: dict, a, out: Path, cache: Path, dtypes: list[str]) -> None:
    from harness.compare import compare_gradients, compare_losses
    from harness.compare.verdict import relative_thresholds
    from harness.contracts.tolerance import Tolerance

    cross = summary["cross_device"]
    config = cross_device_config(a.config, dtypes, out)
    cross["config"] = str(config)
    sides, collected = {}, {}
    for side, device in (("cpu", "cpu"), ("device", a.device)):
        name = f"cross_device/{side}"
        output = out / "cross_device" / side
        budget = summary["budgets"][name]
        # The CPU side needs only its references; --harness-keep-dumps all keeps the device
        # run's gradient files for the comparison below.
        argv = pytest_argv(config, device, 1, "torchrun",
                           output, cache, a.select, None, budget, 1,
                           extra=["--harness-keep-dumps", "all"])
        part = run_part(summary, name, argv, budget,
                        out / "logs" / f"cross_device-{side}.log")
        records, header, folder = session_records(output)
        part["session"] = folder
        part["counts"] = count(r.get("status") for r in records)
        part["ok"] = not part["timed_out"] and part["returncode"] in (0, 5)
        if not part["ok"]:
            part["log_tail"] = log_tail(part["log"])
        sides[side] = {r["name"]: r for r in records}
        collected[side] = (header or {}).get("collected") or []
        write_summary(summary, out)

    names = sorted(set(sides["device"]) | set(collected["device"]) | set(collected["cpu"]))
    for name in names:
        run = sides["device"].get(name) or {"status": None, "reason": "no record: the session "
                                            "ended before this case finished"}
        model, dtype_id = name.split("/")[1], name.split("/")[2]
        check = {"name": name, "model": model, "dtype": dtype_id[len("single-"):],
                 "device_status": run.get("status"), "status": "error", "reason": None}
        cross["checks"].append(check)
        cpu = sides["cpu"].get(name)
        if run.get("status") != "passed" or cpu is None or not cpu.get("reference"):
            check["reason"] = ("the device run " + str(run.get("status")) + ": "
                               + str(run.get("reason"))) if run.get("status") != "passed" \
                else "no CPU reference for this case (the CPU side did not finish it)"
            continue
        ref_key, run_key = dict(cpu["reference"]["key"]), dict(run["reference"]["key"])
        check["reference_devices"] = [ref_key.pop("device", None), run_key.pop("device", None)]
        check["key_match"] = ref_key == run_key
        if not check["key_match"]:
            check["reason"] = "the CPU reference's key differs from the device run's (not device)"
            continue
        ref_dir, got_dir = Path(cpu["reference"]["path"]), Path(run["output_dir"])
        tol = run.get("tolerances") or {}
        loss_tol = Tolerance(**(tol.get("loss") or {"atol": 1e-5}))
        grad_tol = Tolerance(**(tol.get("gradients") or {"atol": 1e-5}))
        relative = relative_thresholds(check["dtype"])
        got_steps, ref_steps = read_steps(got_dir), read_steps(ref_dir)
        loss = compare_losses(got_steps, ref_steps, loss_tol, relative.loss)
        grads = compare_gradients(got_dir / "gradients", ref_dir / "gradients", grad_tol,
                                  relative=relative.gradients)
        ok = loss.ok and grads.ok and grads.parameters > 0 and loss.compared > 0
        ref_loss = {int(s["step"]): s["loss"] for s in ref_steps}
        check.update({
            "status": "passed" if ok else "failed",
            "reason": None if ok else _cross_reason(loss, grads),
            "cpu_reference": str(ref_dir), "device_run": str(got_dir),
            "tolerances": {"loss": loss_tol.to_dict(), "gradients": grad_tol.to_dict()},
            "relative_thresholds": relative.to_dict(),
            "loss": {"max_abs_diff": loss.max_abs_diff, "worst_relative": loss.worst_relative,
                     "compared": loss.compared, "ok": loss.ok},
            "gradients": {"parameters": grads.parameters, "mismatched": len(grads.mismatched),
                          "max_abs_diff": grads.max_abs_diff,
                          "worst_relative": (grads.worst_relative.relative_error
                                             if grads.worst_relative else 0.0),
                          "worst_parameter": (grads.worst_relative.name
                                              if grads.worst_relative else None),
                          "ok": grads.ok},
            "steps": [{"step": int(s["step"]), "device_loss": s["loss"],
                       "cpu_loss": ref_loss.get(int(s["step"])),
                       "abs_diff": (abs(s["loss"] - ref_loss[int(s["step"])])
                                    if int(s["step"]) in ref_loss else None),
                       "step_time_ms": s.get("step_time_ms")} for s in got_steps],
        })
    cross["counts"] = count(c["status"] for c in cross["checks"])


def _cross_reason(loss, grads) -> str:
    parts = []
    if not loss.ok:
        parts.append(f"loss max |d| {loss.max_abs_diff:.3g} (worst relative "
                     f"{loss.worst_relative:.3g})")
    if not grads.ok:
        worst = grads.worst_relative
        parts.append(f"gradients: {len(grads.mismatched)} of {grads.parameters} parameters out "
                     f"of atol, max |d| {grads.max_abs_diff:.3g}"
                     + (f", worst relative {worst.relative_error:.3g} ({worst.name})"
                        if worst else "")
                     + (f", missing {len(grads.missing)}" if grads.missing else ""))
    if grads.parameters == 0:
        parts.append("no gradient files compared")
    return "; ".join(parts) or "nothing compared"


# ----------------------------------------------------------------------------- throughput

def run_throughput(summary: dict, a, out: Path) -> None:
    result = out / "throughput.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "trainer_throughput.py"),
            "--device", a.device, "--preset", a.throughput_preset,
            "--models", *a.throughput_models,
            "--dtypes", *a.throughput_dtypes, "--steps", str(a.throughput_steps),
            "--warmup", str(a.throughput_warmup), "--rounds", str(a.throughput_rounds),
            "--json", str(result)]
    part = run_part(summary, "throughput", argv, summary["budgets"]["throughput"],
                    out / "logs" / "throughput.log")
    data = {}
    if result.is_file():
        data = json.loads(result.read_text())
    rows = data.get("rows") or []
    part["ok"] = not part["timed_out"] and part["returncode"] == 0 and bool(rows)
    if not part["ok"]:
        part["log_tail"] = log_tail(part["log"])
    summary["throughput"] = {"command": part["command"], "settings": {
        k: data.get(k) for k in ("device", "preset", "steps", "warmup", "rounds", "threads")},
        "rows": rows, "status": "passed" if part["ok"] else "failed",
        "note": "trainer / plain loop tokens/s; a short setting, so a rough figure"}


# ----------------------------------------------------------------------------- summary

def _g(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown(summary: dict) -> str:
    env = summary.get("environment") or {}
    gpus = env.get("gpus") or []
    lines = [f"# GPU check ({'dry-run on CPU' if summary['dry_run'] else summary['device']})", "",
             f"- device: {summary['device']}, devices used: {summary['gpus']}"
             + (f" ({', '.join(sorted({g['name'] for g in gpus}))})" if gpus else ""),
             f"- driver {env.get('driver') or '–'}, torch {env.get('torch') or '–'}, "
             f"CUDA {env.get('cuda') or '–'}, cuDNN {env.get('cudnn') or '–'}, "
             f"NCCL {env.get('nccl') or '–'}; host {env.get('host')}, "
             f"CPU {env.get('cpu')} ({env.get('cpu_cores')} cores); commit "
             f"{(env.get('git_commit') or '?')[:12]}",
             f"- selection: -k {summary['select']!r}, -m {summary['marker']!r}; "
             f"wall {_g(summary.get('wall_s'))} s; complete: {summary['complete']}",
             f"- **result: {'PASS' if summary.get('ok') else 'FAIL'}**, checks "
             + ", ".join(f"{k} {v}" for k, v in summary["counts"].items()), ""]
    lines += table([[p["name"], p["budget_s"], _g(p["wall_s"]), _g(p["returncode"]),
                     "yes" if p["timed_out"] else "no", "yes" if p.get("ok") else "NO"]
                    for p in summary["parts"]],
                   ["part", "budget s", "wall s", "rc", "timed out", "ok"], MARKDOWN)
    lines.append("")
    lines += table([[r["launcher"], f"`{r['name']}`", r.get("dtype", "–"),
                     _g(r.get("world_size")), r["status"], _g(r.get("loss_max_abs_diff")),
                     _g(r.get("grad_max_abs_diff")), _g(r.get("grad_relative_worst")),
                     _g(r.get("tokens_per_s")), _g((r.get("timings") or {}).get("run_s"))]
                    for r in summary["matrix"]["cases"] if r.get("status") != "skipped"],
                   ["launcher", "case", "dtype", "world", "status", "loss max |Δ|",
                    "grad max |Δ|", "grad rel", "tokens/s", "run s"], MARKDOWN)
    skipped = sum(1 for r in summary["matrix"]["cases"] if r.get("status") == "skipped")
    lines.append(f"\n{skipped} skipped (need more devices than {summary['gpus']}, or "
                 "deselected by the harness); per launcher: "
                 + "; ".join(f"{k}: " + ", ".join(f"{n} {v[n]}" for n in v)
                             for k, v in summary["matrix"]["counts"].items()))
    agree = summary["matrix"].get("launchers_agree") or {}
    if agree.get("compared"):
        lines.append(f"\nLaunchers agree bit for bit on the losses of {agree['identical']} of "
                     f"{agree['compared']} cases run under both.")
    lines.append("")
    lines += table([cross_row(c) for c in summary["cross_device"]["checks"]],
                   ["cross-device check", "dtype", "status", "loss max |Δ|", "grad max |Δ|",
                    "grad worst rel (threshold)", "reason"], MARKDOWN)
    rows = (summary.get("throughput") or {}).get("rows") or []
    if rows:
        lines.append("")
        lines += table([[r["model"], r["dtype"], r["device"], r["tokens_per_step"],
                         f"{r['trainer_tokens_per_s']:.0f}", f"{r['plain_tokens_per_s']:.0f}",
                         f"{r['ratio']:.3f}"] for r in rows],
                       ["throughput", "dtype", "device", "tokens/step", "trainer tok/s",
                        "plain tok/s", "ratio"], MARKDOWN)
    return "\n".join(lines) + "\n"


def cross_row(check: dict) -> list:
    loss, grads = check.get("loss") or {}, check.get("gradients") or {}
    rel = check.get("relative_thresholds") or {}
    return [f"`{check['name']}`", check["dtype"], check["status"], _g(loss.get("max_abs_diff")),
            _g(grads.get("max_abs_diff")),
            f"{_g(grads.get('worst_relative'))} ({_g(rel.get('gradients'))})",
            check.get("reason") or ""]


def finish_counts(summary: dict) -> None:
    statuses = [r.get("status") for r in summary["matrix"]["cases"]]
    statuses += [c["status"] for c in summary["cross_device"]["checks"]]
    if summary.get("throughput"):
        statuses.append(summary["throughput"]["status"])
    summary["counts"] = count(statuses)
    timed_out = any(p["timed_out"] for p in summary["parts"])
    parts_ok = all(p.get("ok", False) for p in summary["parts"])
    summary["ok"] = (not summary["counts"]["failed"] and not summary["counts"]["error"]
                     and not timed_out and parts_ok and summary["counts"]["passed"] > 0)


def write_summary(summary: dict, out: Path) -> Path:
    finish_counts(summary)
    summary["wall_s"] = round(time.time() - summary["_t0"], 2)
    summary["markdown"] = markdown(summary)
    path = out / f"{SUMMARY}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({k: v for k, v in summary.items() if not k.startswith("_")},
                              indent=1, default=str) + "\n")
    tmp.replace(path)
    (out / f"{SUMMARY}.md").write_text(summary["markdown"])
    return path


# ----------------------------------------------------------------------------- main

def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default reports/gpu_check/<time>)")
    p.add_argument("--quick", action="store_true",
                   help="the matrix's `basic` tag only; throughput of GPT-2 only, fewer steps")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default=os.environ.get("GPU_CHECK_DEVICE", "cuda"),
                   help="cuda (default), or cpu: the dry-run (also GPU_CHECK_DEVICE=cpu)")
    p.add_argument("--gpus", type=int, default=None,
                   help="devices to use (default: every CUDA device; 1 in the CPU dry-run)")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "test_config.json")
    p.add_argument("-k", dest="select", default=None, help="pytest -k for the cases")
    p.add_argument("-m", dest="marker", default=None, help="pytest -m for the matrix")
    p.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    p.add_argument("--workers", type=int, default=None,
                   help="pytest-xdist workers for the matrix (default: 1, or gpus // 2)")
    p.add_argument("--budget-scale", type=float,
                   default=float(os.environ.get("GPU_CHECK_BUDGET_SCALE", "1")),
                   help="multiply every part's time budget (a slow machine)")
    p.add_argument("--no-cross-device", action="store_true")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--throughput-models", nargs="+", default=None)
    p.add_argument("--throughput-dtypes", nargs="+", default=None)
    p.add_argument("--throughput-steps", type=int, default=None)
    p.add_argument("--throughput-warmup", type=int, default=None)
    p.add_argument("--throughput-rounds", type=int, default=1)
    p.add_argument("--throughput-preset", default="bench",
                   help="asset preset of the throughput benchmark (default bench, as in "
                        "docs/benchmarks.md; tiny for a fast dry-run)")
    a = p.parse_args(argv)
    a.config = a.config.resolve()
    if a.quick and a.marker is None:
        a.marker = "basic"
    a.throughput_models = a.throughput_models or (["gpt2"] if a.quick else ["gpt2", "llama3"])
    a.throughput_dtypes = a.throughput_dtypes or ["float32", "bfloat16"]
    a.throughput_steps = a.throughput_steps or (4 if a.quick else 6)
    a.throughput_warmup = a.throughput_warmup if a.throughput_warmup is not None \
        else (1 if a.quick else 2)
    if a.throughput_steps <= a.throughput_warmup:
        p.error("--throughput-steps must be more than --throughput-warmup")
    return a


class Stopped(Exception):
    """SIGTERM from outside (the wrapper's overall timeout): the running part is killed with
    everything it started and the summary written as it stands."""


def _on_term(signum, frame):
    raise Stopped(f"signal {signum}")


def main(argv=None) -> int:
    a = parse(argv)
    signal.signal(signal.SIGTERM, _on_term)
    out = (a.out or REPO / "reports" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "format": FORMAT, "complete": False, "ok": False, "device": a.device,
        "dry_run": a.device == "cpu", "quick": a.quick, "select": a.select, "marker": a.marker,
        "config": str(a.config), "out": str(out), "gpus": None, "launchers": list(a.launchers),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "finished_at": None,
        "budgets": {k: v * a.budget_scale for k, v in BUDGETS.items()}, "parts": [],
        "environment": None, "plan": None,
        "matrix": {"cases": [], "counts": {}, "launchers_agree": None},
        "cross_device": {"checks": [], "counts": count([]), "config": None},
        "throughput": None, "counts": count([]), "problems": [], "_t0": time.time(),
    }
    print(f"gpu_check: device {a.device}{' (dry-run)' if a.device == 'cpu' else ''}, "
          f"out {out}", flush=True)
    env = probe_environment(summary, out)
    summary["environment"] = env
    if a.device == "cuda":
        found = env.get("gpu_count") or 0
        if not found:
            summary["problems"].append(
                "no CUDA device: torch sees none (cuda_available "
                f"{env.get('cuda_available')}, torch {env.get('torch')}); for the CPU dry-run "
                "pass --device cpu")
            summary["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            write_summary(summary, out)
            print(summary["problems"][-1], file=sys.stderr)
            return 2
        a.gpus = min(a.gpus or found, found)
    else:
        a.gpus = a.gpus or 1
    summary["gpus"] = a.gpus
    plan = plan_cases(a.config, a.gpus)
    summary["plan"] = plan
    a.workers = a.workers or (1 if a.gpus == 1 else max(1, a.gpus // 2))
    extra_cases = max(0, plan["fit"] - plan["fit_single_device"])
    for launcher in LAUNCHERS:  # more GPUs: more cases fit; the matrix budgets grow with them
        summary["budgets"][f"matrix/{launcher}"] += (
            MATRIX_PER_CASE_S * a.budget_scale * extra_cases / a.workers if a.gpus > 1 else 0)
    summary["workers"] = a.workers
    print(f"  {plan['fit']} of {plan['total']} cases fit {a.gpus} device(s) "
          f"({plan['fit_by_dtype']}); dtypes {plan['dtypes']}", flush=True)
    write_summary(summary, out)

    cache = out / "reference-cache"
    try:
        run_matrix(summary, a, out, cache)
        write_summary(summary, out)
        if not a.no_cross_device:
            run_cross_device(summary, a, out, cache, plan["dtypes"])
            write_summary(summary, out)
        if not a.no_throughput:
            run_throughput(summary, a, out)
    except (Stopped, KeyboardInterrupt) as stop:
        summary["problems"].append(f"stopped from outside ({stop or 'interrupt'}) during "
                                   f"{summary['parts'][-1]['name'] if summary['parts'] else '?'}")
        summary["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_summary(summary, out)
        print(summary["problems"][-1], file=sys.stderr)
        return 1
    summary["complete"] = True
    summary["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = write_summary(summary, out)
    print(summary["markdown"])
    print(f"summary: {path}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
