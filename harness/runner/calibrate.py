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
from harness.launch import LaunchSpec, free_port
from harness.launch.backends import read_jsonl

MEASUREMENTS = "calibration.jsonl"
FOLDER = "calibration"  # in the session folder: the repeats' runs and their markers

__all__ = ["MEASUREMENTS", "check_repeats", "measure", "read_measurements", "session_thresholds",
           "write_calibrations"]


def dtype_of(case) -> str:
    return case.flags.get("dtype") or "float32"


def session_thresholds(runner, case) -> tuple[RelativeThresholds, dict]:
    """The scale-free thresholds of `case` and its record's `calibration`: the defaults in a
    calibration session (it measures them); else the calibration of this trainer build, device
    and dtype beside the reference cache, clamped (CalibrationError above the ceiling)."""
    dtype = dtype_of(case)
    default = relative_thresholds(dtype)
    if runner.settings.calibrate_repeats:
        return calibrated_thresholds(default, None)
    if dtype not in runner.calibrations:  # read once per dtype per session
        runner.calibrations[dtype] = load_calibration(
            runner.settings.reference_root, runner.backend.version(), runner.settings.device,
            dtype, trainer=runner.backend.name)
    return calibrated_thresholds(default, runner.calibrations[dtype])


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


def measure(runner, case, record, reference, checkpoint: Path, input_bin: Path,
            passed: bool) -> None:
    """A calibration session's part of a case: its own errors when it passed, then (once per
    reference key in the session, whichever worker gets there first) the reference's
    repeats. A repeat that fails raises CalibrationError (the case is an error) and no
    calibration of its group is written."""
    session_dir = runner.settings.session_dir
    if passed:
        relative = ((record.gradients or {}).get("relative") or {})
        _append(session_dir, {**_identity(runner, case), "kind": "case", "case": case.name,
                              "loss": _number(((record.loss or {}).get("relative") or {})
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
    settings = runner.settings
    flags = runner.run_flags(case, reference=True)
    world = case.reference_world_size
    updates = runner.updates_flag(case)
    launched = {**flags, updates: str(folder / "updates")} if updates else flags
    spec = LaunchSpec(case="reference", model=case.model, flags=launched, world_size=world,
                      checkpoint=checkpoint, input_bin=input_bin, output_dir=folder,
                      gradients_dir=folder / "gradients", log_dir=folder / "logs",
                      device=settings.device)
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    with runner.leases.lease(world) as slots:
        spec.slots = slots
        if world > 1:
            spec.port = free_port(settings.session_dir / "ports")
        result = runner._launch(spec)
        outputs = runner.backend.collect(spec, result)
    what = f"calibration repeat {index} of the reference"
    if not result.ok or outputs.problem:
        raise CalibrationError(runner._crash_text(case, spec, result, None,
                                                  runner._rank_logs(spec, result), what=what,
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


# ---------------------------------------------------------------------- the session's end


def read_measurements(session_dir: Path) -> list[dict]:
    path = Path(session_dir) / MEASUREMENTS
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed worker: the rest still count
        if isinstance(entry, dict):
            found.append(entry)
    return found


GROUP = ("trainer", "trainer_version", "device", "dtype")


def write_calibrations(session_dir: Path, reference_root: Path, repeats: int) -> list[str]:
    """Merge a calibration session's measurements, one file per (trainer, trainer version,
    device, dtype): the worst loss and gradient error over every repeat and passing case. A
    group with a failed repeat, or with no repeat at all, gets no file. Returns a line per group
    for the terminal: where its file went, or why there is none."""
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
