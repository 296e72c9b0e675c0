"""Calibration during a session (`--harness-calibrate K`), and the thresholds a case is judged
with (harness.compare.calibration holds the file format, MARGIN, CEILING and the clamp).

In a calibration session every case runs as usual, judged with the default thresholds, and
  * a case that passed contributes its own scale-free errors against its reference (the noise
    of another rounding order: another topology of the same mathematics);
  * each reference key is run K - 1 more times (fresh folders under
    `<session>/calibration/<entry>/repeat-<i>`, never cached, same flags, same device), each
    repeat compared with the cached reference (run-to-run noise: non-deterministic kernels).
A failing case's errors are never noise: noise comes from passing runs, so a calibration
session is run on a known-good build.

With the bundled trainer (backend "harness") each reference key is also run once in float64,
on one device (`<session>/calibration/<entry>/fp64`, flags = the reference's with
--dtype float64): the oracle. Every case, passing or not, gets its fp64 ratio in its record's
`calibration` (`fp64_ratio`, `fp64_ratio()` below): per parameter ||run - fp64|| /
||ref - fp64||, the worst over parameters, and per step |run - fp64| / |ref - fp64| for the
loss, the worst over steps. A case that differs from its reference only by another rounding
order is as far from the exact answer as the reference is: a ratio of order 1; a bug puts the
run orders of magnitude further. Outside calibration sessions and for other trainers it is null.

Measurements go to `<session>/calibration.jsonl`, one JSON line each, appended under a file
lock; the controller merges them into the calibration files at the session's end
(`write_calibrations`). Why the controller and not each worker: only it knows that every worker
is done, so the file is written once from every measurement, never read-modified-written by
workers racing each other, and a session stopped half way leaves its measurements in the session
folder instead of a calibration file made from some of them. Serial sessions take the same path.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import time
from pathlib import Path

import numpy as np
from filelock import FileLock

from harness.compare import Locator, compare_gradients, compare_losses
from harness.compare.calibration import (
    Calibration,
    CalibrationError,
    calibrated_thresholds,
    check_repeats,
    load_calibration,
)
from harness.compare.verdict import RelativeThresholds, relative_thresholds
from harness.contracts.flags import ORACLE_DTYPE
from harness.contracts.records import STEPS_NAME, read_jsonl

from .stages import RunTarget

MEASUREMENTS = "calibration.jsonl"
FOLDER = "calibration"  # in the session folder: the repeats' runs and their markers
ORACLE = "fp64"  # <session>/calibration/<entry>/fp64: the reference key's float64 run

__all__ = ["MEASUREMENTS", "check_repeats", "fp64_ratio", "measure", "oracle_ratio",
           "read_measurements", "session_thresholds", "write_calibrations"]


def dtype_of(case) -> str:
    return case.flags.get("dtype") or "float32"


def session_thresholds(runner, case) -> tuple[RelativeThresholds, dict]:
    """The scale-free thresholds of `case` and its record's `calibration`: the defaults in a
    calibration session (it measures them); else the calibration of this trainer build, device
    and dtype beside the reference cache, clamped (CalibrationError above the ceiling)."""
    dtype = dtype_of(case)
    default = relative_thresholds(dtype)
    if runner.settings.calibrate_repeats:
        thresholds, stored = calibrated_thresholds(default, None)
    else:
        if dtype not in runner.calibrations:  # read once per dtype per session
            runner.calibrations[dtype] = load_calibration(
                runner.settings.reference_root, runner.backend.version(),
                runner.settings.device, dtype, trainer=runner.backend.name)
        thresholds, stored = calibrated_thresholds(default, runner.calibrations[dtype])
    # filled in by `measure` in a calibration session with the bundled trainer
    return thresholds, {**stored, "fp64_ratio": None}


# ---------------------------------------------------------------------- measuring


def _identity(runner, case) -> dict:
    return {"trainer": runner.backend.name, "trainer_version": runner.backend.version(),
            "device": runner.settings.device, "dtype": dtype_of(case),
            "host": socket.gethostname()}


def _append(session_dir: Path, entry: dict) -> None:
    path = session_dir / MEASUREMENTS
    with FileLock(str(session_dir / f".{MEASUREMENTS}.lock")):
        with open(path, "a") as stream:
            stream.write(json.dumps(entry) + "\n")


def _number(value) -> float | None:
    """A record's JSON-safe float ("inf" as a string) back; None when absent."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def oracle_ratio(runner, case, reference, checkpoint: Path, input_bin: Path, run_dir: Path,
                 run_steps: list[dict]) -> dict:
    """A calibration session's fp64 ratio of a bundled trainer's case (its record's
    calibration["fp64_ratio"]); the key's float64 run is made first, once per key. Called
    before the case's dumps are settled: its gradients (`run_dir`/gradients) are read."""
    oracle = _oracle(runner, case, reference, checkpoint, input_bin)
    run_gradients = run_dir / "gradients"
    return fp64_ratio(
        run_gradients if case.compare.gradients and run_gradients.is_dir() else None,
        reference.gradients_dir, oracle / "gradients",
        [(int(s["step"]), s.get("loss")) for s in run_steps] if case.compare.loss else [],
        read_jsonl(reference.steps_file), read_jsonl(oracle / STEPS_NAME))


def measure(runner, case, reference, checkpoint: Path, input_bin: Path,
            passed: dict | None) -> None:
    """A calibration session's part of a case: its own errors when it passed (`passed`: its
    verdict's record, None when it failed), then (once per reference key in the session,
    whichever worker gets there first) the reference's repeats. A repeat that fails raises
    CalibrationError (the case is an error) and no calibration of its group is written."""
    session_dir = runner.settings.session_dir
    if passed is not None:
        relative = ((passed.get("gradients") or {}).get("relative") or {})
        _append(session_dir, {**_identity(runner, case), "kind": "case", "case": case.name,
                              "loss": _number(((passed.get("loss") or {}).get("relative") or {})
                                              .get("worst")),
                              "gradients": _number(relative.get("worst")),
                              "parameter": relative.get("worst_parameter")})
    name = runner.references.entry_name(reference.key)
    folder = session_dir / FOLDER / name
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{name}.lock")):
        failed, done = folder / "FAILED.txt", folder / "DONE"
        if failed.is_file():  # another case of this key met it: this one says it too
            raise CalibrationError(failed.read_text())
        if done.is_file():
            return
        for index in range(1, runner.settings.calibrate_repeats):
            try:
                entry = _repeat(runner, case, reference, checkpoint, input_bin,
                                folder / f"repeat-{index}", index)
            except CalibrationError as error:
                failed.write_text(str(error))
                _append(session_dir, {**_identity(runner, case), "kind": "failure",
                                      "case": case.name, "problem": str(error)})
                raise
            _append(session_dir, entry)
        done.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def _repeat(runner, case, reference, checkpoint: Path, input_bin: Path, folder: Path,
            index: int) -> dict:
    """One more run of the case's reference, as the reference was built (same flags, device and
    process count), compared with the cached one."""
    flags = runner.run_flags(case, reference=True)
    ran = runner.run_target(runner.plan_reference(case, checkpoint, input_bin, folder))
    spec, result, outputs = ran.launched.spec, ran.launched.result, ran.outputs
    what = f"calibration repeat {index} of the reference"
    if ran.failed:
        raise CalibrationError(runner._crash_text(case, spec, result, None,
                                                  ran.launched.rank_logs, what=what,
                                                  problem=outputs.problem))
    entry = {**_identity(runner, case), "kind": "repeat", "repeat": index,
             "case": f"{case.name} (reference repeat {index})", "loss": None,
             "gradients": None, "parameter": None}
    ref_steps = read_jsonl(reference.steps_file)
    if case.compare.loss and ref_steps:
        loss = compare_losses(outputs.steps, ref_steps, case.tolerances.loss, math.inf)
        if loss.missing or loss.nonfinite:
            raise CalibrationError(f"{case.name}: {what} has steps {loss.missing or loss.nonfinite} "
                                   f"missing or not finite: {spec.output_dir}")
        entry["loss"] = _number(loss.worst_relative)
    got = folder / "gradients"
    if case.compare.gradients and list(reference.gradients_dir.glob("*.npy")):
        grads = compare_gradients(got, reference.gradients_dir, case.tolerances.gradients,
                                  Locator.from_layout(None, case.model), relative=math.inf,
                                  tensor_parallel=runner.backend.gradient_shards(flags))
        if grads.missing or grads.extra or grads.shape_errors:
            raise CalibrationError(f"{case.name}: {what} dumped other gradients than the "
                                   f"reference (missing {grads.missing}, extra {grads.extra}, "
                                   f"shapes {grads.shape_errors}): {got}")
        worst = grads.worst_relative
        if worst is not None:
            if not math.isfinite(worst.relative_error):
                raise CalibrationError(f"{case.name}: {what}: {worst.name}'s gradient is not "
                                       f"finite: {got}")
            entry["gradients"], entry["parameter"] = worst.relative_error, worst.name
    for dump in (got, folder / "updates"):  # measured: the summary is in the measurement
        shutil.rmtree(dump, ignore_errors=True)
    return entry


# ---------------------------------------------------------------------- the float64 oracle


def _oracle(runner, case, reference, checkpoint: Path, input_bin: Path) -> Path:
    """The folder of the float64 run of `case`'s reference key: made by the first case of the
    key to get here (file lock, any xdist worker), then read by every case of it. One device,
    the reference's flags (its topology dropped) with --dtype float64, never cached. A run that
    fails raises CalibrationError, for every case of the key."""
    name = runner.references.entry_name(reference.key)
    folder = runner.settings.session_dir / FOLDER / name / ORACLE
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent.parent / f".{name}.{ORACLE}.lock")):
        failed, done = folder.parent / f"{ORACLE}-FAILED.txt", folder / "DONE"
        if failed.is_file():
            raise CalibrationError(failed.read_text())
        if done.is_file():
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # a run cut short by a killed worker
        flags = {**case.reference_flags(), "dtype": ORACLE_DTYPE}
        ran = runner.run_target(RunTarget("fp64-oracle", case.model, flags, 1, checkpoint,
                                          input_bin, folder, gradients=True, port=False))
        spec, result, outputs = ran.launched.spec, ran.launched.result, ran.outputs
        if ran.failed or not outputs.steps:
            text = runner._crash_text(case, spec, result, None, ran.launched.rank_logs,
                                      what="the float64 oracle run of the reference",
                                      problem=outputs.problem)
            failed.write_text(text)
            raise CalibrationError(text)
        done.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    return folder


def _ratio(run_distance: float, ref_distance: float) -> float:
    """|run - fp64| / |ref - fp64|; where the reference is exactly the oracle, 0 if the run is
    too, else inf. A non-finite run (NaN) is inf: nothing is further from the oracle."""
    if not math.isfinite(run_distance):
        return math.inf
    if ref_distance == 0:
        return 0.0 if run_distance == 0 else math.inf
    return run_distance / ref_distance


def fp64_ratio(run_gradients: Path | None, ref_gradients: Path | None,
               oracle_gradients: Path | None, run_steps, ref_steps: list[dict],
               oracle_steps: list[dict]) -> dict:
    """The fp64 ratio of a case: `{gradients, gradients_parameter, loss}`.

    gradients: the largest over parameters of ||run - fp64|| / ||ref - fp64|| (Frobenius
    norms, in float64, over the parameters all three dumps hold with one shape), with the
    parameter it is at; loss: the largest over the steps all three have of
    |run - fp64| / |ref - fp64|. Each ratio is of order 1 when the run differs from its
    reference only by the rounding of another order of operations, orders of magnitude above 1
    for a bug; null where nothing was compared. `run_steps`: step records or (step, loss)
    pairs; the dumps are read with numpy.load (the oracle's are float64)."""
    worst, worst_name = None, None
    folders = (run_gradients, ref_gradients, oracle_gradients)
    if all(f is not None and Path(f).is_dir() for f in folders):
        for path in sorted(Path(oracle_gradients).glob("*.npy")):
            run_file, ref_file = Path(run_gradients) / path.name, Path(ref_gradients) / path.name
            if not (run_file.is_file() and ref_file.is_file()):
                continue  # missing in a dump: the verdict says so
            exact = np.load(path).astype(np.float64, copy=False)
            run = np.load(run_file).astype(np.float64, copy=False)
            ref = np.load(ref_file).astype(np.float64, copy=False)
            if not (run.shape == ref.shape == exact.shape):
                continue  # the verdict's shape error
            ratio = _ratio(float(np.linalg.norm(run - exact)), float(np.linalg.norm(ref - exact)))
            if worst is None or ratio > worst or (ratio == worst and path.stem < worst_name):
                worst, worst_name = ratio, path.stem
    losses = {}
    for entry in run_steps or []:
        step, loss = (entry.get("step"), entry.get("loss")) if isinstance(entry, dict) else entry
        if step is not None and _number(loss) is not None:
            losses[int(step)] = _number(loss)
    reference = {int(s["step"]): _number(s.get("loss")) for s in ref_steps if "step" in s}
    exact = {int(s["step"]): _number(s.get("loss")) for s in oracle_steps if "step" in s}
    loss = None
    for step in sorted(set(losses) & set(reference) & set(exact)):
        if reference[step] is None or exact[step] is None:
            continue
        ratio = _ratio(abs(losses[step] - exact[step]), abs(reference[step] - exact[step]))
        loss = ratio if loss is None else max(loss, ratio)
    return {"gradients": worst, "gradients_parameter": worst_name, "loss": loss}


# ---------------------------------------------------------------------- the session's end


def read_measurements(session_dir: Path) -> list[dict]:
    # A line cut by a killed worker is left out: the rest still count.
    return [entry for entry in read_jsonl(Path(session_dir) / MEASUREMENTS)
            if isinstance(entry, dict)]


GROUP = ("trainer", "trainer_version", "device", "dtype")


def write_calibrations(session_dir: Path, reference_root: Path, repeats: int) -> list[str]:
    """Merge a calibration session's measurements, one file per (trainer, trainer version,
    device, dtype): the worst loss and gradient error over every repeat and passing case. A
    group with a failed repeat, or with no repeat at all, gets no file. Returns a line per group
    for the terminal: where its file went, or why there is none. The float64 oracles'
    gradient dumps go (every worker is done: every case's fp64 ratio is in its record)."""
    for dump in Path(session_dir).glob(f"{FOLDER}/*/{ORACLE}/gradients"):
        shutil.rmtree(dump, ignore_errors=True)  # every case has read it: its ratio is recorded
    groups: dict[tuple, list[dict]] = {}
    for entry in read_measurements(session_dir):
        key = tuple(entry.get(k) for k in GROUP)
        groups.setdefault(key, []).append(entry)
    lines = []
    for key, entries in sorted(groups.items(), key=lambda item: str(item[0])):
        trainer, version, device, dtype = key
        label = f"{trainer} {version} on {device}, {dtype}"
        failures = [e for e in entries if e.get("kind") == "failure"]
        measured = [e for e in entries if e.get("kind") in ("case", "repeat")]
        if failures:
            lines.append(f"calibration of {label} not written: {len(failures)} reference "
                         f"repeat(s) failed ({failures[0].get('case')}: "
                         f"{str(failures[0].get('problem')).splitlines()[0]})")
            continue
        if not any(e.get("kind") == "repeat" for e in measured):
            lines.append(f"calibration of {label} not written: no reference was repeated "
                         f"(no case of it passed or ran)")
            continue
        losses = [e for e in measured if e.get("loss") is not None]
        grads = [e for e in measured if e.get("gradients") is not None]
        worst_grad = max(grads, key=lambda e: (e["gradients"], str(e.get("case"))),
                         default=None)
        hosts = sorted({str(e.get("host")) for e in measured})
        calibration = Calibration(
            trainer=str(trainer), trainer_version=str(version), device=str(device),
            host=hosts[0] if len(hosts) == 1 else ",".join(hosts), dtype=str(dtype),
            repeats=repeats,
            cases=len({e["case"] for e in measured if e.get("kind") == "case"}),
            loss_noise=max((e["loss"] for e in losses), default=None),
            gradients_noise=worst_grad["gradients"] if worst_grad else None,
            worst_parameter=worst_grad.get("parameter") if worst_grad else None,
            worst_case=worst_grad.get("case") if worst_grad else None,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        path = calibration.write(reference_root)
        lines.append(f"calibration written: {path} (gradient noise "
                     f"{_shown(calibration.gradients_noise)}, loss noise "
                     f"{_shown(calibration.loss_noise)}; {calibration.cases} passing case(s), "
                     f"{repeats} runs of each reference)")
    return lines


def _shown(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3g}"
