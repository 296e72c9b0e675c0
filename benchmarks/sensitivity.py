"""Which verdict catches which planted bug, next to the measured noise floor (issue 12 item 2).

    python benchmarks/sensitivity.py SESSION_DIR [--case basic/gpt2/pp2] [--no-runs]
        [--calibration FILE] [--tablefmt github]

SESSION_DIR is a session whose passing cases kept their gradient dumps (run with
`--harness-keep-dumps all`). From the chosen pipeline case and its single-device reference:

- noise: the case as it ran (a correct parallel run: another rounding order);
- stage scaling 1e-3 / 1e-4 / 1e-5: every gradient the case's layout puts on the last stage
  scaled by (1 + e), on the case's own dump;
- dropped microbatch: the reference trainer run with one microbatch fewer (total batch minus
  batch x sequence), its gradients and step-1 loss scaled by (n - 1) / n: what a loop that skips
  one microbatch but still divides by n computes (first step only);
- wrong norm eps: the reference trainer run with GPT-2's LayerNorm eps 1e-6 instead of 1e-5
  (in-process patch of harness.trainer.models.gpt2.model.LAYER_NORM_EPS).

Each probe is judged element-wise with the case's own tolerances (the record's `tolerances`:
the config's, else the defaults of harness/cases/expand.py) and scale-free with the dtype's
default thresholds (harness/compare/verdict.py); with `--calibration FILE` (a file a
`--harness-calibrate K` session wrote under `<reference cache>/calibration/`) also with the
thresholds a later session takes from it (harness.compare.calibration.calibrated_thresholds:
max(default, noise x 10), an error above the ceiling), side by side. The last column names
the verdicts that catch the probe. Only gradients and the loss are probed (not the parameter
updates). `--no-runs` skips the two trainer runs.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from harness.cases import Tolerance
from harness.compare import Locator, compare_gradients, compare_losses
from harness.compare.calibration import Calibration, CalibrationError, calibrated_thresholds
from harness.compare.verdict import RelativeThresholds, margin, passes, relative_thresholds
from harness.contracts.records import RESULTS_NAME, read_jsonl, read_steps


@dataclass(frozen=True)
class ThresholdSet:
    """One column pair of the table: the scale-free thresholds a probe is judged with."""

    label: str  # "default", "calibrated"
    thresholds: RelativeThresholds
    source: str  # where they came from, for the header


@dataclass(frozen=True)
class Measured:
    """One probe's differences, judged element-wise (the scale-free verdicts are per set)."""

    probe: str
    grad_max_abs: float
    grad_elementwise_caught: bool
    grad_rel: float
    grad_rel_at: str
    loss_max_abs: float
    loss_elementwise_caught: bool
    loss_rel: float
    loss_compared: bool = True  # False: the probe leaves the loss as the case ran (stage scaling)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("session")
    p.add_argument("--case", default="basic/gpt2/pp2")
    p.add_argument("--no-runs", action="store_true")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="also judge with the thresholds a session takes from this calibration "
                        "file (harness.compare.calibration.calibrated_thresholds)")
    p.add_argument("--tablefmt", default="simple", help="tabulate format (github: markdown)")
    return p.parse_args(argv)


def threshold_sets(dtype: str, calibration: Path | None) -> list[ThresholdSet]:
    """The defaults of `dtype`, then (with a file) the calibrated thresholds. A file that
    cannot be read, is of another dtype, or whose noise is above the ceiling is a ValueError
    naming it (never quietly judged with the defaults)."""
    default = relative_thresholds(dtype)
    sets = [ThresholdSet("default", default, "harness.compare.verdict defaults")]
    if calibration is None:
        return sets
    try:
        cal = Calibration.read(calibration)
        if cal.dtype != dtype:
            raise ValueError(f"{calibration}: a calibration for {cal.dtype}, the case is {dtype}")
        chosen, info = calibrated_thresholds(default, cal)
    except CalibrationError as error:
        raise ValueError(str(error)) from None
    noise = (f"noise: gradients {_g(info['gradients_noise'])}, loss {_g(info['loss_noise'])}; "
             f"{cal.repeats} repeats, {cal.cases} cases, host {cal.host}")
    sets.append(ThresholdSet("calibrated", chosen, f"{calibration} ({noise})"))
    return sets


def _g(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def trainer_flags(command: list[str]) -> list[str]:
    """The trainer's own flags from a recorded command: after `--` of the zygote launcher
    (`python -m harness.launch.zygote run ... -- FLAGS`), else after `harness.trainer`
    (`python -m harness.trainer FLAGS` or torchrun ... `-m harness.trainer FLAGS`)."""
    if "harness.launch.zygote" in command and "--" in command:
        return list(command[command.index("--") + 1:])
    for marker in ("harness.trainer", "harness.trainer.main"):
        if marker in command:
            return list(command[command.index(marker) + 1:])
    raise ValueError(f"not a bundled-trainer command: {command!r}")


def dropped_microbatch_flags(flags: list[str]) -> tuple[list[str], int]:
    """The flags with one microbatch fewer (total batch minus batch x sequence), and n, the
    case's microbatch count."""
    values = dict(f.split("=", 1) for f in flags if f.startswith("--") and "=" in f)
    micro = int(values["--batch_size"]) * int(values["--sequence_length"])
    n = int(values["--total_batch_size"]) // micro
    if n < 2:
        raise ValueError(f"one microbatch only (total {values['--total_batch_size']}, "
                         f"microbatch {micro}): nothing to drop")
    fewer = [f for f in flags if not f.startswith("--total_batch_size=")]
    fewer.append(f"--total_batch_size={(n - 1) * micro}")
    return fewer, n


def measure(probe, got_dir, ref_dir, got_losses, ref_losses, tolerances: dict, locator,
            loss_compared: bool = True) -> Measured:
    grad_tol = Tolerance(**tolerances["gradients"])
    loss_tol = Tolerance(**tolerances["loss"])
    g = compare_gradients(got_dir, ref_dir, grad_tol, locator)
    loss = compare_losses(got_losses, ref_losses, loss_tol)
    worst = g.worst_relative
    return Measured(probe, g.max_abs_diff, not g.elementwise_ok,
                    worst.relative_error if worst else 0.0, worst.name if worst else "-",
                    loss.max_abs_diff, not loss.elementwise_ok, loss.worst_relative,
                    loss_compared)


def caught_by(m: Measured, sets: list[ThresholdSet]) -> list[str]:
    """The verdicts that fail the probe, in table order."""
    out = []
    if m.grad_elementwise_caught:
        out.append("grad element-wise")
    for s in sets:
        if not passes(m.grad_rel, s.thresholds.gradients):
            out.append(f"grad scale-free {s.label}")
    if m.loss_compared:
        if m.loss_elementwise_caught:
            out.append("loss element-wise")
        for s in sets:
            if not passes(m.loss_rel, s.thresholds.loss):
                out.append(f"loss scale-free {s.label}")
    return out


def _verdict(value: float, threshold: float) -> str:
    """'caught' / 'pass' with the margin threshold / value (x)."""
    m = margin(threshold, value)
    text = "inf" if math.isinf(m) else f"{m:.3g}"
    return f"{'pass' if passes(value, threshold) else 'CAUGHT'} ({text}x)"


def headers(sets: list[ThresholdSet], tolerances: dict) -> list[str]:
    gt, lt = tolerances["gradients"], tolerances["loss"]
    h = ["probe", "grad max|Δ|", f"element-wise (atol {gt['atol']:g}, rtol {gt['rtol']:g})",
         "grad max ‖Δ‖/‖ref‖ (at)"]
    h += [f"scale-free {s.label} ({s.thresholds.gradients:.3g})" for s in sets]
    h += ["loss max|Δ|", f"element-wise (atol {lt['atol']:g})", "loss max |Δ|/max(|loss|,1)"]
    h += [f"scale-free {s.label} ({s.thresholds.loss:.3g})" for s in sets]
    return h + ["caught by"]


def row(m: Measured, sets: list[ThresholdSet]) -> list[str]:
    r = [m.probe, f"{m.grad_max_abs:.3g}", "CAUGHT" if m.grad_elementwise_caught else "pass",
         f"{m.grad_rel:.3g} ({m.grad_rel_at})"]
    r += [_verdict(m.grad_rel, s.thresholds.gradients) for s in sets]
    if m.loss_compared:
        r += [f"{m.loss_max_abs:.3g}", "CAUGHT" if m.loss_elementwise_caught else "pass",
              f"{m.loss_rel:.3g}"]
        r += [_verdict(m.loss_rel, s.thresholds.loss) for s in sets]
    else:  # the loss is the case's own: the noise row's
        r += ["(as run)"] * (3 + len(sets))
    return r + [", ".join(caught_by(m, sets)) or "nothing"]


def table(measured: list[Measured], sets: list[ThresholdSet], tolerances: dict,
          tablefmt: str = "simple") -> str:
    return tabulate([row(m, sets) for m in measured], headers=headers(sets, tolerances),
                    tablefmt=tablefmt)


def steps(values, first=1):
    return [{"step": first + i, "loss": v} for i, v in enumerate(values)]


def trainer_run(flags: list[str], out: Path, eps: float | None = None) -> list[float]:
    """The bundled trainer in one process with `flags`, its outputs (gradients; no parameter
    updates) redirected under `out`; the losses of steps.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    args = [a for a in flags if not a.startswith(("--output_dir=", "--dump_gradients=",
                                                  "--dump_parameter_updates="))]
    args += [f"--output_dir={out}", f"--dump_gradients={out / 'gradients'}"]
    patch = (f"import harness.trainer.models.gpt2.model as m; m.LAYER_NORM_EPS = {eps!r}; "
             if eps is not None else "")
    code = (f"import sys; {patch}from harness.trainer.main import main; "
            f"sys.exit(main({args!r}))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return [float(step["loss"]) for step in read_steps(out)]


def scale_files(src: Path, dst: Path, names: set[str], factor: float) -> None:
    shutil.copytree(src, dst)
    for name in names:
        a = np.load(dst / f"{name}.npy")
        np.save(dst / f"{name}.npy", (a * np.float32(factor)).astype(np.float32))


def read_records(session: Path) -> dict:
    records = {}
    for r in read_jsonl(Path(session) / RESULTS_NAME, missing_ok=False):
        if isinstance(r, dict) and "name" in r:
            records[r["name"]] = r
    return records


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    records = read_records(Path(a.session))
    if a.case not in records:
        print(f"no case {a.case!r} in {a.session}", file=sys.stderr)
        return 2
    r = records[a.case]
    dtype = r["flags"]["dtype"]
    try:
        sets = threshold_sets(dtype, a.calibration)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    tolerances = r["tolerances"]
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
    rows = [measure("noise (the case as it ran)", got_dir, ref_dir, got_losses, ref_losses,
                    tolerances, locator)]
    tmp = Path(tempfile.mkdtemp(prefix="sensitivity-"))
    try:
        for e in (1e-3, 1e-4, 1e-5):
            dst = tmp / f"scaled-{e:g}"
            scale_files(got_dir, dst, on_last, 1 + e)
            rows.append(measure(f"stage {last} gradients x (1 + {e:g}) ({len(on_last)} params)",
                                dst, ref_dir, got_losses, ref_losses, tolerances, locator,
                                loss_compared=False))
        if not a.no_runs:
            flags = trainer_flags(r["reference"]["command"])
            fewer, n = dropped_microbatch_flags(flags)
            losses = trainer_run(fewer, tmp / "dropped")
            dropped = tmp / "dropped-scaled"
            scale_files(tmp / "dropped" / "gradients", dropped, names, (n - 1) / n)
            rows.append(measure(f"dropped microbatch (1 of {n}, step 1)", dropped, ref_dir,
                                steps([losses[0] * (n - 1) / n]), ref_losses[:1], tolerances,
                                locator))
            if r["model"] == "gpt2":
                losses = trainer_run(flags, tmp / "eps", eps=1e-6)
                rows.append(measure("LayerNorm eps 1e-6 instead of 1e-5",
                                    tmp / "eps" / "gradients", ref_dir, steps(losses),
                                    ref_losses, tolerances, locator))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"case {a.case} ({dtype}); element-wise: gradients {tolerances['gradients']}, loss "
          f"{tolerances['loss']} (the record's tolerances)")
    for s in sets:
        print(f"scale-free {s.label}: gradients {s.thresholds.gradients:.3g}, loss "
              f"{s.thresholds.loss:.3g} ({s.source})")
    print(table(rows, sets, tolerances, a.tablefmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
