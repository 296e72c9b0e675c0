"""Scale-free thresholds calibrated on the machine under test (docs/verdicts.md,
"Calibration"). Plain Python, no torch.

GPU kernels are not bitwise deterministic (atomics, split-K, autotuned reduction orders), so the
default thresholds of harness.compare.verdict, measured on deterministic CPU runs, can sit below
a real GPU's run-to-run noise. A calibration session (`--harness-calibrate K`) measures that
noise on this machine and writes, beside the reference cache,

    <reference_root>/calibration/<trainer-version>-<device>-<dtype>.json

(`Calibration`, format "harness.calibration/1"). Later sessions on the same host, trainer build,
device and dtype take their scale-free thresholds from it:

    threshold = max(default, noise x MARGIN), and an error when noise x MARGIN > CEILING

so a calibration can only loosen the defaults, never below them, and never so far that the bug
the thresholds exist for passes: above the ceiling no threshold both passes this machine's
noise and catches that bug, and every case of the dtype is an error saying so (never a silent
pass). A file for this trainer and dtype made on another host, by another trainer build or for
another dtype is reported (`CalibrationLookup.problem`, in the record and the report) and not
used: the defaults are.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path

from .verdict import RelativeThresholds

FORMAT = "harness.calibration/1"
FOLDER = "calibration"  # under the reference cache's root
MIN_REPEATS = 3  # one repeat gives one difference, two a spread of two: K >= 3 to estimate

# The threshold sits MARGIN times above the worst noise measured: the noise of a session is a
# sample of a few runs, and its worst grows with more runs and cases (the defaults keep 9x..62x
# above the CPU noise they were chosen from, harness.compare.verdict); 10x keeps within that.
MARGIN = 10.0

# The largest threshold that still catches the bug each verdict is there for:
#   float32 gradients 5e-5: a 1e-4 bug on one stage (its gradients scaled by 1 + 1e-4) gives a
#       per-parameter ||d||/||ref|| of exactly 1e-4 (harness.compare.verdict); 5e-5 keeps it
#       failing by 2x. The default is 1e-5.
#   float32 loss 5e-5: the same rule, a loss 1e-4 off (relative) still fails by 2x. 5x the
#       default (1e-5, chosen from 2e-6 measured between a PP run and one GPU on an H200), so a
#       GPU's loss noise up to 5e-6 can be calibrated; the 1e-5 the issue first proposed would
#       equal the default and refuse any fp32 loss noise above 1e-6, which that GPU exceeds.
#   bfloat16 gradients 5e-2: a dropped microbatch of 8 leaves 7/8 of the gradient, an error of
#       0.125; 5e-2 keeps it failing by 2.5x (the default is 2e-2).
#   bfloat16 loss 1e-2: the same dropped microbatch moves the loss by up to 1/8 of its
#       difference from the mean, and a loss scaled by 7/8 is 0.125 off: 1e-2 keeps 12x
#       (100x the default 1e-4, bf16's loss rounding is coarse on a GPU).
CEILING = {
    "float32": RelativeThresholds(loss=5e-5, gradients=5e-5),
    "bfloat16": RelativeThresholds(loss=1e-2, gradients=5e-2),
}
# What a threshold above the ceiling would let pass, for the error text.
CAUGHT = {
    ("float32", "gradients"): "a 1e-4 stage bug",
    ("float32", "loss"): "a 1e-4 loss error",
    ("bfloat16", "gradients"): "a dropped microbatch of 8 (0.125)",
    ("bfloat16", "loss"): "a loss 1/8 off (a dropped microbatch of 8)",
}


class CalibrationError(ValueError):
    """A calibration file that cannot be read, or one whose noise is above the ceiling; the
    message names the file, the value and what was expected."""


def check_repeats(repeats) -> int:
    """--harness-calibrate K: K >= MIN_REPEATS (ValueError otherwise)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < MIN_REPEATS:
        raise ValueError(f"a calibration needs K >= {MIN_REPEATS} repeats to estimate "
                         f"anything; got {repeats}")
    return repeats


def file_name(trainer_version: str, device: str, dtype: str) -> str:
    """`<trainer-version>-<device>-<dtype>.json`, the version made safe for a file name."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", str(trainer_version)) or "_"
    return f"{safe}-{device}-{dtype}.json"


def calibration_path(root: str | Path, trainer_version: str, device: str, dtype: str) -> Path:
    return Path(root) / FOLDER / file_name(trainer_version, device, dtype)


def _noise(value, name: str, where: str) -> float | None:
    if value is None:
        return None  # nothing of this kind was measured (no gradients compared)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise CalibrationError(f"{where}: {name} is {value!r}, expected a finite number >= 0 "
                               f"or null")
    return float(value)


def _text(value, name: str, where: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise CalibrationError(f"{where}: {name} is {value!r}, expected a non-empty string"
                               + (" or null" if optional else ""))
    return value


@dataclass(frozen=True)
class Calibration:
    """One calibration file: the worst scale-free errors measured over `repeats` runs of each
    reference and the `cases` that passed, on `host`, for a trainer build, device and dtype."""

    trainer: str
    trainer_version: str
    device: str
    host: str
    dtype: str
    repeats: int
    cases: int
    loss_noise: float | None
    gradients_noise: float | None
    worst_parameter: str | None
    worst_case: str | None
    created_at: str
    format: str = FORMAT
    path: Path | None = field(default=None, compare=False)  # where it was read; not written

    def __post_init__(self) -> None:
        where = str(self.path) if self.path is not None else "calibration"
        if self.format != FORMAT:
            raise CalibrationError(f"{where}: format is {self.format!r}, expected {FORMAT!r}")
        for name in ("trainer", "trainer_version", "device", "host", "created_at"):
            _text(getattr(self, name), name, where)
        for name in ("worst_parameter", "worst_case"):
            _text(getattr(self, name), name, where, optional=True)
        if self.dtype not in CEILING:
            raise CalibrationError(f"{where}: dtype is {self.dtype!r}, expected one of "
                                   f"{sorted(CEILING)}")
        if self.device not in ("cpu", "cuda"):
            raise CalibrationError(f"{where}: device is {self.device!r}, expected 'cpu' or "
                                   f"'cuda'")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) \
                or self.repeats < MIN_REPEATS:
            raise CalibrationError(f"{where}: repeats is {self.repeats!r}, expected an integer "
                                   f">= {MIN_REPEATS} (a calibration needs K >= {MIN_REPEATS} "
                                   f"repeats to estimate anything)")
        if isinstance(self.cases, bool) or not isinstance(self.cases, int) or self.cases < 0:
            raise CalibrationError(f"{where}: cases is {self.cases!r}, expected an integer "
                                   f">= 0")
        for name in ("loss_noise", "gradients_noise"):
            object.__setattr__(self, name, _noise(getattr(self, name), name, where))

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "path"}
        return {"format": data.pop("format"), **data}

    @classmethod
    def from_json(cls, data, where: str | Path = "calibration") -> Calibration:
        """A file's object back; an unknown or missing key is a CalibrationError naming it."""
        where = str(where)
        if not isinstance(data, dict):
            raise CalibrationError(f"{where}: a calibration is a JSON object, not "
                                   f"{type(data).__name__}")
        if data.get("format") != FORMAT:
            raise CalibrationError(f"{where}: format is {data.get('format')!r}, expected "
                                   f"{FORMAT!r}")
        keys = [f.name for f in fields(cls) if f.name != "path"]
        unknown = sorted(set(data) - set(keys))
        if unknown:
            raise CalibrationError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                                   f"a {FORMAT} file has {', '.join(keys)}")
        missing = [k for k in keys if k not in data]
        if missing:
            raise CalibrationError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")
        return cls(**data, path=Path(where))

    @classmethod
    def read(cls, path: str | Path) -> Calibration:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CalibrationError(f"{path}: not a readable calibration file: {error}") from None
        return cls.from_json(data, path)

    def write(self, root: str | Path) -> Path:
        """Write it to its place under `root` (write, then rename: a reader never sees half;
        the partial file is named by host and process, so two writers never share one)."""
        path = calibration_path(root, self.trainer_version, self.device, self.dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
        partial.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        partial.replace(path)
        return path


@dataclass(frozen=True)
class CalibrationLookup:
    """What load_calibration found: the calibration to use (None: the defaults), and a
    `problem` when a file exists for this trainer and dtype that is not used (another host,
    trainer build or dtype), with that `file`."""

    calibration: Calibration | None
    problem: str | None = None
    file: Path | None = None


def load_calibration(root: str | Path, trainer_version: str, device: str, dtype: str | None,
                     trainer: str | None = None, host: str | None = None) -> CalibrationLookup:
    """The calibration of this trainer build, device and dtype under `root` (the reference
    cache), made on this host. A file of the same name that cannot be read is a
    CalibrationError (it was meant for this session: never skipped). A file that does not fit
    (another host, build, device or dtype inside it), or, when there is none of this name, a
    file of the same trainer for another build or dtype, gives a lookup with no calibration
    and the `problem` said."""
    dtype = dtype or "float32"
    host = host or socket.gethostname()
    path = calibration_path(root, trainer_version, device, dtype)
    if path.is_file():
        found = Calibration.read(path)
        differs = [(what, got, want) for what, got, want in (
            ("host", found.host, host), ("trainer build", found.trainer_version,
                                         trainer_version),
            ("device", found.device, device), ("dtype", found.dtype, dtype),
            ("trainer", found.trainer, trainer or found.trainer)) if got != want]
        if differs:
            text = "; ".join(f"{what} {got!r}, this session {want!r}" for what, got, want
                             in differs)
            return CalibrationLookup(None, f"the calibration {path} was made for another "
                                           f"environment ({text}): not used, the default "
                                           f"thresholds are", path)
        return CalibrationLookup(found, None, path)
    others = []
    folder = Path(root) / FOLDER
    for other in sorted(folder.glob("*.json")):  # none when there is no folder
        try:
            cal = Calibration.read(other)
        except CalibrationError:
            continue  # another file's problem: it is reported where it is the one looked up
        if trainer is not None and cal.trainer != trainer:
            continue
        if cal.trainer_version != trainer_version and cal.device == device \
                and cal.dtype == dtype:
            others.append(f"the calibration {other} is of trainer build "
                          f"{cal.trainer_version!r}, not this session's {trainer_version!r} "
                          f"(run --harness-calibrate on this build)")
        elif cal.trainer_version == trainer_version and cal.device == device \
                and cal.dtype != dtype:
            others.append(f"the calibration {other} is for {cal.dtype}, not {dtype}")
    if others:
        return CalibrationLookup(None, "; ".join(others) + ": not used, the default "
                                                           "thresholds are")
    return CalibrationLookup(None)


def _ceiling_text(calibration: Calibration, what: str, noise: float, ceiling: float) -> str:
    if what == "gradients":
        where = f" at {calibration.worst_parameter or 'an unnamed parameter'}"
        if calibration.worst_case:
            where += f" (case {calibration.worst_case})"
    else:
        where = ""
    file = calibration.path or "(unsaved)"
    caught = CAUGHT[(calibration.dtype, what)]  # every dtype a Calibration accepts
    noun = "gradient" if what == "gradients" else "loss"
    return (f"the calibration {file} measured {noun} noise {noise:.3g}{where}: x the margin "
            f"{MARGIN:g} that is {noise * MARGIN:.3g}, above the ceiling {ceiling:.3g} of "
            f"{calibration.dtype} {noun} thresholds, so no threshold both passes this "
            f"machine's noise and catches {caught} (calibrate again on a known-good build, "
            f"or remove the file to judge with the defaults)")


def calibrated_thresholds(default: RelativeThresholds,
                          calibration: Calibration | CalibrationLookup | None,
                          ) -> tuple[RelativeThresholds, dict]:
    """The thresholds a case is judged with, and what its record stores as `calibration`:
    `{file, gradients_noise, loss_noise, thresholds: {loss, gradients}, problem}`. Without a
    calibration, `default`; with one, per verdict max(default, noise x MARGIN), a
    CalibrationError when noise x MARGIN is above CEILING."""
    problem = None
    if isinstance(calibration, CalibrationLookup):
        problem = calibration.problem
        calibration = calibration.calibration
    if calibration is None:
        return default, {"file": None, "gradients_noise": None, "loss_noise": None,
                         "thresholds": default.to_dict(), "problem": problem}
    ceiling = CEILING[calibration.dtype]
    chosen = {}
    for what in ("loss", "gradients"):
        noise = getattr(calibration, f"{what}_noise")
        base = getattr(default, what)
        if noise is None:
            chosen[what] = base
            continue
        limit = getattr(ceiling, what)
        if noise * MARGIN > limit:
            raise CalibrationError(_ceiling_text(calibration, what, noise, limit))
        chosen[what] = max(base, noise * MARGIN)
    thresholds = RelativeThresholds(**chosen)
    return thresholds, {"file": str(calibration.path) if calibration.path else None,
                        "gradients_noise": calibration.gradients_noise,
                        "loss_noise": calibration.loss_noise,
                        "thresholds": thresholds.to_dict(), "problem": problem}
