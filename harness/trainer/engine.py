"""What the training loop asks of a way to run the model: one interface, two implementations.

The loop owns data, optimizer, records and dumps; an engine owns where the model's parts live and
how one step's forward and backward run over them. `SingleDeviceEngine` is the reference;
`harness.trainer.parallel` provides the engine for pipeline / tensor / data parallelism. Both
compute the same loss: the mean cross-entropy over every token of the step.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class Engine(Protocol):
    parts: list[nn.Module]
    """The modules holding this rank's parameters (the optimizer updates exactly these)."""

    reports_loss: bool
    """True on the one rank that prints and records the step (the last stage's first rank)."""

    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """loss_fn(logits, targets): a microbatch's mean loss, `cross_entropy` unless wrapped
    (the layer profiler wraps it to time the loss as part of `lm_head`)."""

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Run one step: inputs and targets are (microbatches, B, T) for the whole step, every
        data-parallel rank's share included. Leaves the parameters' .grad as the gradient of the
        step's mean loss, and returns that loss where reports_loss, else None."""

    def gradients(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full gradient) of each parameter this rank writes in a gradient dump. Over all
        ranks every parameter is yielded exactly once, under its single-device name."""

    def full_tensors(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs of this rank's parameters (same order on every rank of a TP
        group) in their single-device form, for the ranks that write dumps; [] elsewhere."""


def compute_dtype(name: str) -> torch.dtype:
    """The torch dtype of a --dtype value (flags.TRAINER_DTYPES). float64 is no autocast: the
    model's parameters are float64 and every operation runs in float64 (one device only)."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


def require_device(kind: str) -> None:
    """Refuse --device=cuda where torch sees no CUDA device (FlagError, exit 2)."""
    from harness.trainer.flags import FlagError

    if kind == "cuda" and not torch.cuda.is_available():
        raise FlagError("--device=cuda but torch sees no CUDA device")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in float32 whatever the compute dtype (float64 in a
    float64 run: its logits are never narrowed)."""
    if logits.dtype != torch.float64:
        logits = logits.float()
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype in (torch.float32, torch.float64):  # float64: the parameters are float64 already
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def accumulate_microbatches(model, inputs, targets, device, dtype, loss_fn) -> torch.Tensor:
    """Forward and backward of every microbatch of (microbatches, B, T) inputs through one
    model, leaving .grad as the gradient of the mean loss; returns that mean (float64)."""
    microbatches = inputs.shape[0]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for x, y in zip(inputs.to(device), targets.to(device)):
        with autocast(device, dtype):
            logits = model(x)
        # Each microbatch's mean divided by their count: the step's mean over all tokens.
        loss = loss_fn(logits, y) / microbatches
        loss.backward()
        total += loss.detach()
    return total


class SingleDeviceEngine:
    """The whole model on one device, with gradient accumulation over the step's microbatches."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.parts = [model]
        self.reports_loss = True
        self.loss_fn = cross_entropy
        self.device = device
        self.dtype = dtype

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        return float(
            accumulate_microbatches(
                self.model, inputs, targets, self.device, self.dtype, self.loss_fn
            )
        )

    def gradients(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, parameter in self.model.named_parameters():
            if parameter.grad is not None:
                yield name, parameter.grad

    def full_tensors(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """The single-device form of per-parameter tensors this rank writes in a dump."""
        return list(named)
