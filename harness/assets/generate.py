"""Deterministic synthetic llm.c checkpoints and token files.

Files written into one directory (``{preset}`` is the preset's name):

    gpt2_{preset}.bin                  GPT-2 checkpoint, version 3 (float32)
    llama3_{preset}.bin                LLaMA 3 checkpoint, version 3 (float32)
    tokens_gpt2_{preset}_train.bin     uint16 token file (magic 20240520)
    tokens_gpt2_{preset}_val.bin
    tokens_llama3_{preset}_train.bin   uint32 token file (magic 20240801), the same ids
    tokens_llama3_{preset}_val.bin
    assets.json                        manifest: preset, seed, configs, every file's sha256

Everything derives from the seed through numpy's Generator (no torch), each stream from its own
SeedSequence so generating one model alone gives the same bytes as generating both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

import numpy as np
from filelock import FileLock

from harness.contracts.llmc import parameter_shapes, write_checkpoint, write_tokens
from harness.contracts.models import MODEL_SPECS, UnknownModelError, is_norm_gain, spec_for_config
from harness.contracts.records import write_atomic

from .presets import PRESETS, Preset

MODELS = tuple(MODEL_SPECS)  # every registered model family
MANIFEST = "assets.json"
# Bump when the bytes generated for a given (preset, seed) change, so caches regenerate.
GENERATOR_VERSION = 1
_STREAMS = {"train": 3, "val": 4, **{s.name: s.asset_stream for s in MODEL_SPECS.values()}}


def _rng(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, _STREAMS[stream]]))


def file_names(preset: str, model: str) -> dict[str, str]:
    return {
        "checkpoint": f"{model}_{preset}.bin",
        "train": f"tokens_{model}_{preset}_train.bin",
        "val": f"tokens_{model}_{preset}_val.bin",
    }


def init_weights(config, seed: int) -> dict[str, np.ndarray]:
    """GPT-2-style init: N(0, 0.02), residual projections (c_proj) scaled by 1/sqrt(2 L).
    Norm weights are 1 + N(0, 0.02) and biases N(0, 0.02) rather than exactly 1 and 0: with
    the exact values a loader that skipped or swapped norms or biases (leaving torch's default
    1 / 0) would still match the reference and the bug would go unseen."""
    rng = _rng(seed, spec_for_config(config).name)
    proj_std = 0.02 / math.sqrt(2 * config.n_layer)
    tensors = {}
    for name, shape in parameter_shapes(config).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if is_norm_gain(name):
            tensors[name] = 1.0 + 0.02 * noise
        elif name.endswith("c_proj.weight"):
            tensors[name] = proj_std * noise
        else:
            tensors[name] = 0.02 * noise
    return tensors


def _prose() -> str:
    return resources.files("harness.assets").joinpath("data/prose.txt").read_text("ascii")


def token_stream(n: int, seed: int, split: str) -> np.ndarray:
    """``n`` byte-level tokens of English prose: paragraphs in a fresh seeded order each pass,
    so the stream has real structure (loss falls well below log V) without repeating one
    fixed period."""
    paragraphs = [p.strip() for p in _prose().split("\n\n") if p.strip()]
    rng = _rng(seed, split)
    chunks, total = [], 0
    while total < n:
        for i in rng.permutation(len(paragraphs)):
            chunk = np.frombuffer((paragraphs[i] + "\n\n").encode("ascii"), dtype=np.uint8)
            chunks.append(chunk)
            total += chunk.size
    return np.concatenate(chunks)[:n].astype(np.int64)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def generate_assets(out_dir: str | os.PathLike, preset: str = "tiny", seed: int = 0,
                    models=MODELS) -> dict:
    """Write the preset's files for ``models`` into ``out_dir``; returns the manifest."""
    p: Preset = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    streams = {split: token_stream(n, seed, split)
               for split, n in (("train", p.train_tokens), ("val", p.val_tokens))}
    files, configs = {}, {}
    for model in models:
        config = p.config(model)
        configs[model] = dataclasses.asdict(config)
        names = file_names(preset, model)
        write_checkpoint(out / names["checkpoint"], config, init_weights(config, seed))
        for split, tokens in streams.items():
            write_tokens(out / names[split], tokens, kind=model)
        for role, name in names.items():
            files[name] = {"model": model, "role": role, "bytes": (out / name).stat().st_size,
                           "sha256": _sha256(out / name)}
    manifest = {"generator_version": GENERATOR_VERSION, "preset": preset, "seed": seed,
                "models": list(models), "configs": configs, "files": files}
    # No timestamps: the same (preset, seed) gives a byte-identical manifest too.
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


# --------------------------------------------------------------------------- cached assets

@dataclass(frozen=True)
class AssetPaths:
    root: Path  # the directory holding this preset's files
    preset: str
    seed: int
    manifest: Path
    # model -> {"checkpoint", "train", "val"} -> path (file_names' roles), per model
    files: Mapping[str, Mapping[str, Path]] = field(default_factory=dict, hash=False)

    def _of(self, model: str) -> Mapping[str, Path]:
        try:
            return self.files[model]
        except KeyError:
            raise UnknownModelError(f"assets {self.root} hold no model {model!r}; known models: "
                                    f"{', '.join(self.files)}") from None

    def checkpoint(self, model: str) -> Path:
        return self._of(model)["checkpoint"]

    def tokens(self, model: str, split: str = "train") -> Path:
        """The model's token file of ``split``: "train" or "val"."""
        return self._of(model)[split]


def default_assets_root() -> Path:
    env = os.environ.get("HARNESS_ASSETS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "harness" / "assets"


def _is_complete(root: Path, preset: str, seed: int) -> bool:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        if (manifest.get("generator_version"), manifest.get("preset"), manifest.get("seed"),
                manifest.get("models")) != (GENERATOR_VERSION, preset, seed, list(MODELS)):
            return False
        for name, info in manifest["files"].items():
            path = root / name
            if path.stat().st_size != info["bytes"] or _sha256(path) != info["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_assets(preset: str = "tiny", root: str | os.PathLike | None = None,
                  seed: int = 0) -> AssetPaths:
    """The preset's files under ``root/{preset}-seed{seed}/``, generated on first use and
    regenerated when a file is missing or its sha256 no longer matches the manifest. A file lock
    makes concurrent callers (pytest-xdist workers) generate once."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = Path(root) if root is not None else default_assets_root()
    d = base / f"{preset}-seed{seed}"
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / f".{d.name}.lock")):
        if not _is_complete(d, preset, seed):
            generate_assets(d, preset, seed, MODELS)
    paths = {model: {role: d / name for role, name in file_names(preset, model).items()}
             for model in MODELS}
    return AssetPaths(root=d, preset=preset, seed=seed, manifest=d / MANIFEST, files=paths)
