"""Make a stand-in InfiniTrain build folder.

``make_build_dir(path)`` writes, all ``#!/bin/sh`` scripts that exec the interpreter running
this code (``sys.executable``) with PYTHONPATH set to this repository's root:

    <build>/gpt2                      -> python -m tests.infinitrain_standin.trainer gpt2 "$@"
    <build>/llama3                    -> python -m tests.infinitrain_standin.trainer llama3 "$@"
    <build>/infini_run                -> python -m tests.infinitrain_standin.infini_run "$@"
    <build>/tools/infini_run/infini_run   (the same launcher: where CMake puts the target
                                           built from tools/infini_run/ in a real build tree)

The launcher's canonical path is ``<build>/infini_run``; the second copy only mirrors a CMake
build tree layout. The scripts pin BLAS/OpenMP to one thread (the runs are tiny and many).
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _script(module: str, *fixed: str) -> str:
    args = " ".join(shlex.quote(a) for a in fixed)
    return ("#!/bin/sh\n"
            f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            ": \"${OPENBLAS_NUM_THREADS:=1}\" \"${OMP_NUM_THREADS:=1}\" \"${MKL_NUM_THREADS:=1}\"\n"
            "export OPENBLAS_NUM_THREADS OMP_NUM_THREADS MKL_NUM_THREADS\n"
            f"exec {shlex.quote(sys.executable)} -m {module} {args} \"$@\"\n")


def make_build_dir(path: Path) -> Path:
    """Create (or refresh) the stand-in build folder at ``path`` and return it."""
    path = Path(path)
    (path / "tools" / "infini_run").mkdir(parents=True, exist_ok=True)
    files = {
        path / "gpt2": _script("tests.infinitrain_standin.trainer", "gpt2"),
        path / "llama3": _script("tests.infinitrain_standin.trainer", "llama3"),
        path / "infini_run": _script("tests.infinitrain_standin.infini_run"),
        path / "tools" / "infini_run" / "infini_run": _script("tests.infinitrain_standin.infini_run"),
    }
    for f, text in files.items():
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


if __name__ == "__main__":
    print(make_build_dir(Path(sys.argv[1] if len(sys.argv) > 1 else "build")))
