"""`--dump_gradients DIR`: every parameter's gradient after the first step, one file each.

`DIR/<name>.npy` holds the full float32 gradient (shape as the parameter's; float64 in a
`--dtype float64` run, the calibration's oracle, read with numpy.load) under the
single-device parameter name, so a single-device dump and any parallel dump have the same file
names and shapes and can be diffed file by file. `DIR/manifest.json` lists every file with its
shape and the rank that wrote it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

DUMP_FORMAT = "harness.gradients/1"
MANIFEST = "manifest.json"


def write_gradients(
    directory: str | os.PathLike, gradients: Iterable[tuple[str, "object"]], rank: int = 0
) -> list[dict]:
    """Write each (name, tensor) as DIR/name.npy; returns the manifest entries written."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, gradient in gradients:
        wide = isinstance(gradient, torch.Tensor) and gradient.dtype == torch.float64
        if isinstance(gradient, torch.Tensor):  # a float64 run's tensors stay float64
            gradient = gradient.detach().to("cpu", torch.float64 if wide else torch.float32)
            gradient = gradient.numpy()
        array = np.ascontiguousarray(gradient, dtype=np.float64 if wide else np.float32)
        # Write-then-rename: a reader never sees half a file.
        partial = directory / f".{name}.npy.partial"
        with open(partial, "wb") as stream:
            np.save(stream, array)
        os.replace(partial, directory / f"{name}.npy")
        entries.append({"name": name, "shape": list(array.shape), "rank": rank})
    return entries


def parameter_tensors(parts, spec) -> list[tuple[str, "object"]]:
    """Every parameter of these model parts under its single-device name, in a fixed order.
    A tied parameter's alias (GPT-2's `lm_head.weight`) is listed too: a part holding both ends
    has one Parameter for both, written under both names, so a run's parameter-update dump and
    its reference's have the same files however the model is split (on a last pipeline stage
    `lm_head.weight` is its own copy, which the optimizer must step like `wte.weight`)."""
    out = []
    for part in parts:
        named = dict(part.named_parameters())
        out += named.items()
        for kept, alias in spec.tied_parameters:
            if kept in named and alias not in named and part.has_lm_head:
                out.append((alias, named[kept]))
    return out


def write_manifest(directory: str | os.PathLike, entries: list[dict], step: int) -> None:
    names = [entry["name"] for entry in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RuntimeError(f"gradients written by more than one rank: {duplicates}")
    manifest = {
        "format": DUMP_FORMAT,
        "step": step,
        "parameters": sorted(entries, key=lambda entry: entry["name"]),
    }
    path = Path(directory) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(directory: str | os.PathLike) -> dict:
    path = Path(directory) / MANIFEST
    manifest = json.loads(path.read_text())
    if manifest.get("format") != DUMP_FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {DUMP_FORMAT!r}")
    return manifest
