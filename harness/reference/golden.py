"""Golden records: a reference kept with the environment it was made in, for cases whose
reference cannot be run where they are checked (a model no single device holds, a trainer
build that is no longer there), and for checking one trainer build against an earlier one.

`--harness-golden-write DIR` copies each reference a session uses (its steps and gradient dump)
into `DIR/<model>-<digest>/` with `golden.json`: the key (model, its files' hashes, the
reference flags, the device kind; not the trainer, which is what changes between the recording
and the check) and the environment fingerprint (trainer version, torch where the bundled trainer
runs, GPU model and driver). `--harness-golden DIR` then uses these instead of running
references. A golden from another environment is refused with one line naming what differs
(`--harness-golden-allow-mismatch` accepts it, recorded); a missing golden is an error naming
the case and the key, never a pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.contracts.records import STEPS_NAME

from .cache import ReferenceEntry, ReferenceError, key_digest

GOLDEN_FORMAT = "harness.golden/1"
GOLDEN_FILE = "golden.json"
# Fingerprint fields that must agree for a golden to be used; "trainer" may differ: a golden
# exists to check a changed trainer against the one that recorded it.
CHECKED = ("device", "torch", "gpu", "driver")


def golden_key(reference_key: dict) -> dict:
    """A reference key without the trainer's identity."""
    return {k: v for k, v in reference_key.items() if k != "trainer"}


def environment_fingerprint(trainer: str, device: str, torch_matters: bool) -> dict:
    """Where a reference was made: the trainer's version, the device kind, torch's version
    (for the bundled trainer, which runs on it), the GPU model and driver (CUDA only)."""
    fingerprint = {"trainer": trainer, "device": device, "torch": None, "gpu": None,
                   "driver": None}
    if torch_matters:
        from importlib.metadata import PackageNotFoundError, version

        try:
            fingerprint["torch"] = version("torch")
        except PackageNotFoundError:
            fingerprint["torch"] = "not installed"
    if device == "cuda":
        fingerprint["gpu"], fingerprint["driver"] = _nvidia_smi()
    return fingerprint


def _nvidia_smi() -> tuple[str | None, str | None]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    first = out.strip().splitlines()[0] if out.strip() else ""
    name, _, driver = first.partition(",")
    return (name.strip() or None), (driver.strip() or None)


def mismatches(recorded: dict, now: dict) -> dict[str, tuple]:
    """The checked fingerprint fields that differ: {field: (recorded, now)}."""
    return {f: (recorded.get(f), now.get(f)) for f in CHECKED if recorded.get(f) != now.get(f)}


def fingerprint_mismatch_text(found: dict[str, tuple]) -> str:
    return "; ".join(f"{field} {old!r} then, {new!r} now" for field, (old, new) in found.items())


@dataclass(frozen=True)
class Golden:
    entry: ReferenceEntry  # steps.jsonl and gradients/ as a reference entry has them
    fingerprint: dict
    recorded_at: str


class GoldenStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def folder(self, key: dict) -> Path:
        return self.root / f"{key['model']}-{key_digest(golden_key(key))}"

    def write(self, key: dict, reference: ReferenceEntry, fingerprint: dict) -> Path:
        """Copy a reference entry in (atomically: a temporary folder renamed into place)."""
        target = self.folder(key)
        scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        scratch.mkdir(parents=True)
        try:
            shutil.copy2(reference.steps_file, scratch / STEPS_NAME)
            if reference.gradients_dir.is_dir():
                shutil.copytree(reference.gradients_dir, scratch / "gradients")
            (scratch / GOLDEN_FILE).write_text(json.dumps({
                "format": GOLDEN_FORMAT, "key": golden_key(key), "fingerprint": fingerprint,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2))
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return target

    def read(self, key: dict, case: str) -> Golden:
        folder = self.folder(key)
        try:
            data = json.loads((folder / GOLDEN_FILE).read_text())
        except FileNotFoundError:
            raise ReferenceError(
                f"{case}: no golden record for its reference in {self.root} (looked for "
                f"{folder.name}: model {key['model']}, flags {key['flags']}); record one with "
                f"--harness-golden-write {self.root}") from None
        except (OSError, ValueError) as error:
            raise ReferenceError(f"{case}: golden record {folder / GOLDEN_FILE} is unreadable: "
                                 f"{error}") from None
        if data.get("format") != GOLDEN_FORMAT or data.get("key") != golden_key(key):
            raise ReferenceError(f"{case}: golden record {folder / GOLDEN_FILE} is not for this "
                                 f"reference (format {data.get('format')!r}, expected "
                                 f"{GOLDEN_FORMAT!r} and the same key)")
        entry = ReferenceEntry(path=folder, key=key, built=False,
                               info={"golden": str(folder), "fingerprint": data["fingerprint"],
                                     "recorded_at": data.get("recorded_at")})
        return Golden(entry, data["fingerprint"], data.get("recorded_at", ""))
