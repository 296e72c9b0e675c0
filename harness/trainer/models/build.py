"""Building model parts and filling them with llm.c-named weights."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from harness.contracts.models import MODEL_SPECS, UnknownModelError
from harness.trainer.models.common import ModelPart
from harness.trainer.models.registry import train_spec_for_config


def build_model(
    config,
    layers: Iterable[int] | None = None,
    embedding: bool = True,
    final_norm: bool = True,
    lm_head: bool = True,
) -> ModelPart:
    """The model (or part) of the family whose config ``config`` is (its
    ``TrainSpec.model``); ``layers`` are global layer indices."""
    try:
        spec = train_spec_for_config(config)
    except UnknownModelError:
        expected = " or ".join(s.config.__name__ for s in MODEL_SPECS.values())
        raise TypeError(
            f"build_model: unsupported config type {type(config).__name__}; "
            f"expected {expected}"
        ) from None
    return spec.model(
        config, layers=layers, embedding=embedding, final_norm=final_norm, lm_head=lm_head
    )


def source_name(module: nn.Module, name: str) -> str:
    """The tensor name a parameter of ``module`` is loaded from / reported under.

    Its own name, except a GPT-2 part's ``lm_head.weight`` (the tied head on a part without
    the embedding), which is ``wte.weight``.
    """
    return module.source_name(name) if isinstance(module, ModelPart) else name


def load_weights(
    module: nn.Module, tensors: Mapping[str, np.ndarray | torch.Tensor]
) -> list[str]:
    """Copy into ``module`` the tensors it owns from ``tensors`` (name -> array).

    ``tensors`` may hold more (the other parts' tensors); every parameter of ``module`` must be
    found there with the right shape, or nothing is copied and a ValueError names what is
    missing / mismatched. A GPT-2 part's ``lm_head.weight`` is read from ``lm_head.weight``
    when present, else from ``wte.weight``. Values are cast to each parameter's dtype and
    device. Returns the source names used, in parameter order.
    """
    plan: list[tuple[nn.Parameter, str]] = []
    missing: list[str] = []
    mismatched: list[str] = []
    for name, param in module.named_parameters():
        key = name if name in tensors else source_name(module, name)
        if key not in tensors:
            missing.append(name if key == name else f"{name} (from {key})")
            continue
        shape = tuple(np.shape(tensors[key]))
        if shape != tuple(param.shape):
            mismatched.append(f"{key}: got {shape}, expected {tuple(param.shape)}")
            continue
        plan.append((param, key))
    if missing or mismatched:
        parts = [f"load_weights({type(module).__name__}):"]
        if missing:
            parts.append(f"missing tensors: {', '.join(missing)}")
        if mismatched:
            parts.append(f"shape mismatches: {'; '.join(mismatched)}")
        raise ValueError(" ".join(parts))
    with torch.no_grad():
        for param, key in plan:
            param.copy_(_as_tensor(tensors[key]))
    return [key for _, key in plan]


def _as_tensor(value: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, copy=True, order="C")  # from_numpy wants a writable array
    return torch.from_numpy(arr)

