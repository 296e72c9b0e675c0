"""A foreign trainer's gradient dump against the PyTorch baseline's, parameter by parameter.

The two dumps name and cut parameters differently (harness.contracts.semantics, FACTS): the
subject writes InfiniTrain's state-dict names (`transformer.h.3.attn.c_attn.weight`), the
bundled trainer llm.c's (`h.3.attn.c_attn.weight`); the bundled trainer writes a tied
parameter once (GPT-2's `lm_head.weight` is `wte.weight`), InfiniTrain under both names; and
the bundled trainer keeps llm.c's padded vocabulary where InfiniTrain at TP 1 holds only the
real one. So each side is linked into a folder of its own under one naming (the case's output
holds both), and those two are compared as a case's dump and its reference's are
(harness.compare.diff.compare_gradients: a TP rank's un-gathered file against its slice).
Plain numpy, no torch.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.compare.diff import GradientDiff, compare_gradients, gradient_names
from harness.contracts.models import MODEL_SPECS
from harness.contracts.semantics import (VOCABULARY_PARAMETERS, BaselineUnmatched,
                                        baseline_parameter_name)
from harness.contracts.tolerance import Tolerance


@dataclass(frozen=True)
class GradientRequest:
    """A case's gradient dump, to compare with its baseline's first step: the folder, the TP
    degree its sharded files are cut by, the self-check's thresholds, and a folder of the
    case's own where both sides are linked under one naming."""
    run_dir: Path
    work_dir: Path
    tolerance: Tolerance
    relative: float | None
    tensor_parallel: int = 1


def _fresh(folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _link(source: Path, target: Path) -> None:
    os.symlink(source.resolve(), target)


def subject_view(model: str, run_dir: Path, view: Path) -> dict[str, tuple[int, ...]]:
    """Link every file of the subject's dump into `view` under the bundled trainer's name;
    returns each name's shape. BaselineUnmatched: no naming recorded for the program, or two
    of the run's files for one parameter."""
    names = {name: baseline_parameter_name(model, name) for name in gradient_names(run_dir)}
    bundled = list(names.values())
    clashes = sorted({b for b in bundled if bundled.count(b) > 1})
    if clashes:
        raise BaselineUnmatched(f"{run_dir}: {', '.join(clashes)}: two of the run's files are "
                                f"one parameter under the bundled trainer's names; expected "
                                f"one file each")
    shapes = {}
    for name, target in names.items():
        _link(run_dir / f"{name}.npy", view / f"{target}.npy")
        shapes[target] = np.load(run_dir / f"{name}.npy", mmap_mode="r").shape
    return shapes


def baseline_view(model: str, baseline_dir: Path, view: Path,
                  subject_shapes: dict[str, tuple[int, ...]], tensor_parallel: int) -> None:
    """Link the baseline's dump into `view`: a tied parameter also under its alias (the one
    gradient both names have), and at TP 1 a vocabulary-sized gradient cut to the subject's
    rows when the subject holds fewer (its model has no padded rows; a copy, not a link)."""
    names = gradient_names(baseline_dir)
    files = {name: baseline_dir / f"{name}.npy" for name in names}
    spec = MODEL_SPECS.get(model)
    for kept, alias in (spec.tied_parameters if spec else ()):
        if kept in files and alias not in files:
            files[alias] = files[kept]
    for name, source in sorted(files.items()):
        target = view / f"{name}.npy"
        shape = subject_shapes.get(name)
        if tensor_parallel == 1 and name in VOCABULARY_PARAMETERS and shape is not None:
            whole = np.load(source, mmap_mode="r")
            if len(shape) == whole.ndim == 2 and shape[1] == whole.shape[1] \
                    and shape[0] < whole.shape[0]:
                np.save(target, np.ascontiguousarray(whole[:shape[0]]))
                continue
        _link(source, target)


def compare_with_baseline(model: str, request: GradientRequest,
                          baseline_dir: Path) -> GradientDiff:
    """The subject's first-step gradients against the baseline's, every baseline parameter
    (its aliases included) compared: missing, extra, another shape or over the thresholds
    fails, as in the self-check."""
    work = _fresh(request.work_dir)
    try:
        shapes = subject_view(model, request.run_dir, _fresh(work / "run"))
        baseline_view(model, baseline_dir, _fresh(work / "baseline"), shapes,
                      request.tensor_parallel)
        return compare_gradients(work / "run", work / "baseline", request.tolerance,
                                 relative=request.relative,
                                 tensor_parallel=request.tensor_parallel)
    finally:  # derived: links, and a cut copy of a vocabulary (154 MB for GPT-2 124M's wte)
        shutil.rmtree(work, ignore_errors=True)
