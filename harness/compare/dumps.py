"""Bounded disk: what happens to a case's gradient dump once it has been diffed.

Policy (`--harness-keep-dumps`): `failed` (default) keeps the dumps of failing cases only,
`all` keeps every dump, `none` keeps none. The record keeps every parameter's summary (norms,
max |diff|, relative error: GradientDiff.to_dict()["per_parameter"]), so a removed dump still
says what it held. Plain Python.
"""

from __future__ import annotations

import shutil
from pathlib import Path

KEEP_DUMPS = ("failed", "all", "none")


def folder_bytes(folder: str | Path | None) -> int:
    """Bytes of the regular files under `folder` (0 when it does not exist)."""
    if folder is None or not Path(folder).is_dir():
        return 0
    total = 0
    for path in Path(folder).rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def keeps(policy: str, passed: bool) -> bool:
    if policy not in KEEP_DUMPS:
        raise ValueError(f"keep-dumps is {policy!r}; expected one of {', '.join(KEEP_DUMPS)}")
    return policy == "all" or (policy == "failed" and not passed)


def settle_dumps(gradients_dir: str | Path | None, passed: bool, policy: str = "failed") -> dict:
    """Remove the dump unless the policy keeps it; returns the record's `dumps` entry:
    {policy, kept, bytes (the dump's size), removed_bytes}."""
    size = folder_bytes(gradients_dir)
    keep = keeps(policy, passed)
    if not keep and gradients_dir is not None and Path(gradients_dir).is_dir():
        shutil.rmtree(gradients_dir, ignore_errors=True)
    exists = gradients_dir is not None and Path(gradients_dir).is_dir()
    return {"policy": policy, "kept": bool(exists), "bytes": size,
            "removed_bytes": 0 if exists else size}
