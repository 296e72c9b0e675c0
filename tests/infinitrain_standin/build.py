"""Make a stand-in InfiniTrain build folder.

``make_build_dir(path, flavour="pr209", cuda=True, models=("gpt2", "llama3"))`` writes, all
``#!/bin/sh`` scripts that exec the interpreter running this code (``sys.executable``) with
PYTHONPATH set to this repository's root:

    <build>/gpt2                      -> python -m tests.infinitrain_standin.trainer gpt2 @build:F:D "$@"
    <build>/llama3                    -> python -m tests.infinitrain_standin.trainer llama3 @build:F:D "$@"
    <build>/infini_run                -> python -m tests.infinitrain_standin.infini_run "$@"
    <build>/tools/infini_run/infini_run   (the same launcher: where CMake puts the target
                                           built from tools/infini_run/ in a real build tree)

``models`` picks which trainers the folder holds (a folder with only ``llama3``, say).
``mixtral_config="file"`` makes the folder's ``tiny_mixtral`` a build compiled with its
checkpoint's own config (STANDIN_MIXTRAL_CONFIG=file, tiny_mixtral.py), so small files load.

The build's flavour and device support are baked into each trainer script as its fixed
``@build:<flavour>:<cuda|cpu>`` argument, so every binary of a folder behaves the same way:

- ``flavour="master"``: the flag sets of InfiniTrain master b24d92f's ``example/<model>/main.cc``
  exactly (no ``dump_gradients``, no ``pipeline_*`` layout flags); ``"pr209"``: master plus
  #209's four layout flags on both and ``dump_gradients`` on ``gpt2`` only.
- the feature-branch flavours ``"lr_scheduler"`` (feat/lr_scheduler a7949ac), ``"qwen3"``
  (feat/add_Qwen3-8B a3f84f8), ``"support_moe"`` (feat/support_moe b7e0760, which adds the
  ``tiny_mixtral`` program: ``<build>/tiny_mixtral`` -> ``python -m
  tests.infinitrain_standin.tiny_mixtral @build:F:D @program:tiny_mixtral "$@"``, or its later rename
  ``mixtral`` with ``models=(..., "mixtral")``; the qwen3 flavour adds ``<build>/qwen3`` -> ``python -m
  tests.infinitrain_standin.qwen3 @build:F:D "$@"``, qwen3.py), ``"context_parallel"``
  (feat/context_parallel d03ba16) and ``"activation_checkpointing"`` (feat/activation_checkpointing
  e594d9c): each branch's gpt2 / llama3 flag sets and behaviours (see trainer.py's flag_set and
  the package docstring).
- ``cuda=True``: a CUDA build. ``cuda=False``: a CPU build (``USE_CUDA=OFF``), which fails as the
  real one does: any run with more than one rank (threads, or infini_run's processes) and any
  single-device ``--device cuda`` run aborts in ``device_guard.cc:161`` (use ``--device cpu``).

Recognising a CUDA build from the file: a real CUDA build's ELF names ``libcudart.so``,
``libcublas.so`` (and ``libnccl.so`` with NCCL) as needed libraries (CMakeLists.txt:138-152
links CUDA::cudart, CUDA::cublas, nccl). A tool that scans a binary's bytes for ``b"libcudart"``,
``b"libnccl"`` or ``b"libcublas"`` therefore finds them in a CUDA stand-in script, which carries
the comment line ``# links: libcudart.so libnccl.so libcublas.so``, and none of those strings in a
CPU one. ``infini_run`` links only gflags and glog (tools/infini_run/CMakeLists.txt), so its
scripts never carry them.

The launcher's canonical path is ``<build>/infini_run``; the second copy only mirrors a CMake
build tree layout. The scripts pin BLAS/OpenMP to one thread (the runs are tiny and many).
"""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CUDA_LINKS = "# links: libcudart.so libnccl.so libcublas.so\n"
CPU_LINKS = "# links: (CPU build: no CUDA libraries)\n"


def _script(module: str, *fixed: str, links: str = "", env: str = "") -> str:
    args = " ".join(shlex.quote(a) for a in fixed)
    return ("#!/bin/sh\n"
            + links
            + f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            ": \"${OPENBLAS_NUM_THREADS:=1}\" \"${OMP_NUM_THREADS:=1}\" \"${MKL_NUM_THREADS:=1}\"\n"
            "export OPENBLAS_NUM_THREADS OMP_NUM_THREADS MKL_NUM_THREADS\n"
            + env
            + f"exec {shlex.quote(sys.executable)} -m {module} {args} \"$@\"\n")


FLAVOURS = ("master", "pr209", "lr_scheduler", "qwen3", "support_moe", "context_parallel",
            "activation_checkpointing")
ALL_MODELS = ("gpt2", "llama3", "tiny_mixtral", "mixtral", "qwen3")
# the programs only a flavour's build holds: tiny_mixtral and its rename on support_moe, qwen3 on qwen3
_FLAVOUR_OF = {"tiny_mixtral": "support_moe", "mixtral": "support_moe", "qwen3": "qwen3"}


def default_models(flavour: str) -> tuple[str, ...]:
    """The programs a build of that flavour holds by default: gpt2 and llama3, plus tiny_mixtral
    on support_moe (feat/support_moe:CMakeLists.txt:204-210 builds example/tiny_mixtral) and qwen3 on
    qwen3 (feat/add_Qwen3-8B:CMakeLists.txt:193 builds example/qwen3). ``models=(..., "mixtral")``
    on support_moe plays the later commit that renamed tiny_mixtral (later@0d2bfc7:
    example/mixtral/main.cc: the same flags, its stdout step line ending with peak memory)."""
    return {"support_moe": ("gpt2", "llama3", "tiny_mixtral"),
            "qwen3": ("gpt2", "llama3", "qwen3")}.get(flavour, ("gpt2", "llama3"))


def make_build_dir(path: Path, flavour: str = "pr209", cuda: bool = True,
                   models: tuple[str, ...] | list[str] | None = None, mixtral_config: str = "") -> Path:
    """Create (or refresh) the stand-in build folder at ``path`` and return it. Trainer scripts of
    models not named are removed, so a refreshed folder holds exactly ``models`` (default: the
    flavour's ``default_models``). ``mixtral_config="file"``: the folder's ``tiny_mixtral`` plays a
    build compiled with the checkpoint's own config (its script sets STANDIN_MIXTRAL_CONFIG=file
    unless the environment sets it; see tiny_mixtral.py); ``""``: config.h's."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, not {flavour!r}")
    if mixtral_config not in ("", "file"):
        raise ValueError(f"mixtral_config must be '' (config.h) or 'file', not {mixtral_config!r}")
    if models is None:
        models = default_models(flavour)
    bad = [m for m in models if m not in ALL_MODELS]
    if bad:
        raise ValueError(f"unknown models {bad}")
    for model in models:
        if _FLAVOUR_OF.get(model, flavour) != flavour:
            raise ValueError(f"{model} exists only in the {_FLAVOUR_OF[model]} flavour")
    path = Path(path)
    (path / "tools" / "infini_run").mkdir(parents=True, exist_ok=True)
    tag = f"@build:{flavour}:{'cuda' if cuda else 'cpu'}"
    links = CUDA_LINKS if cuda else CPU_LINKS
    for m in ALL_MODELS:
        if m not in models and (path / m).exists():
            (path / m).unlink()
    mixtral_env = (f": \"${{STANDIN_MIXTRAL_CONFIG={mixtral_config}}}\"\nexport STANDIN_MIXTRAL_CONFIG\n"
                   if mixtral_config else "")
    def script(model: str) -> str:
        if model in ("tiny_mixtral", "mixtral"):  # one program under its two names
            return _script("tests.infinitrain_standin.tiny_mixtral", tag, f"@program:{model}", links=links,
                           env=mixtral_env)
        if model == "qwen3":
            return _script("tests.infinitrain_standin.qwen3", tag, links=links)
        return _script("tests.infinitrain_standin.trainer", model, tag, links=links)

    files = {path / m: script(m) for m in models}
    files[path / "infini_run"] = _script("tests.infinitrain_standin.infini_run")
    files[path / "tools" / "infini_run" / "infini_run"] = _script("tests.infinitrain_standin.infini_run")
    for f, text in files.items():
        if any(s in text for s in ("libcudart", "libnccl", "libcublas")) != (cuda and f.name in models):
            raise RuntimeError(f"{f}: CUDA markers must appear exactly in a CUDA build's trainers")
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


if __name__ == "__main__":
    print(make_build_dir(Path(sys.argv[1] if len(sys.argv) > 1 else "build")))
