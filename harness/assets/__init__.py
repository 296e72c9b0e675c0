"""Deterministic synthetic llm.c checkpoints and token files (``python -m harness.assets``).

These are the built-in defaults everything else uses when no real files are configured:
``ensure_assets("tiny")`` generates them once (per preset and seed) and reuses them.
"""

from .generate import (
    AssetPaths,
    default_assets_root,
    ensure_assets,
    file_names,
    generate_assets,
    init_weights,
    token_stream,
)
from .presets import PRESETS, Preset

__all__ = [
    "PRESETS",
    "AssetPaths",
    "Preset",
    "default_assets_root",
    "ensure_assets",
    "file_names",
    "generate_assets",
    "init_weights",
    "token_stream",
]
