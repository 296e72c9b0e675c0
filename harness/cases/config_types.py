"""The loaded config's types: tolerances, what a case compares, model files, assets, the
trainer, one expanded case, and the whole config. Each checks itself on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Flags that define the single-device reference (with the model and its files).
REFERENCE_FLAGS = ("dtype", "batch_size", "sequence_length", "total_batch_size", "num_iteration",
                   "learning_rate", "weight_decay", "optimizer", "seed")


@dataclass(frozen=True)
class Tolerance:
    """Pass when |got - ref| <= atol + rtol * |ref|, element-wise."""

    atol: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} is {value!r}; expected a finite number >= 0")

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol}

    def __str__(self) -> str:
        return f"atol={self.atol:g} rtol={self.rtol:g}"


@dataclass(frozen=True)
class Tolerances:
    loss: Tolerance
    gradients: Tolerance

    def to_dict(self) -> dict:
        return {"loss": self.loss.to_dict(), "gradients": self.gradients.to_dict()}


@dataclass(frozen=True)
class Compare:
    loss: bool = True
    gradients: bool = True

    def __post_init__(self) -> None:
        if not (self.loss or self.gradients):
            raise ValueError("compares nothing; expected `loss` or `gradients` to be true")

    def to_dict(self) -> dict:
        return {"loss": self.loss, "gradients": self.gradients}


@dataclass(frozen=True)
class ModelFiles:
    """A model's checkpoint and token file; both None means the built-in synthetic assets."""

    checkpoint: Path | None = None
    input_bin: Path | None = None

    @property
    def synthetic(self) -> bool:
        return self.checkpoint is None


@dataclass(frozen=True)
class Assets:
    preset: str = "tiny"
    seed: int = 0
    dir: Path | None = None


@dataclass(frozen=True)
class TrainerSpec:
    """Which trainer runs the cases: ours (`harness`) or a command template (`command`)."""

    backend: str = "harness"
    command: tuple[str, ...] = ()
    version: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in ("harness", "command"):
            raise ValueError(f"backend is {self.backend!r}; expected 'harness' or 'command'")
        if self.backend == "command" and not self.command:
            raise ValueError("backend 'command' needs a `command` template (a list of strings)")


@dataclass(frozen=True)
class Case:
    """One (tag, case, model): what a pytest item runs."""

    tag: str
    case_id: str
    model: str
    flags: dict[str, Any]  # trainer flags (resolved hyper-parameters + the case's own)
    world_size: int
    tolerances: Tolerances
    compare: Compare
    source: str  # e.g. "test_groups[1].tests[3]"
    description: str = ""
    # InfiniTrain-only flags (name -> value): our trainer skips the case; a command backend
    # gets them passed through.
    extra_flags: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        need = self.pp * self.tp
        if self.world_size < 1 or self.world_size % need:
            raise ValueError(f"world size {self.world_size} is not a multiple of "
                             f"tensor_parallel * pipeline_parallel = {need}")

    @property
    def name(self) -> str:
        """The pytest name: `tag/model/id`, stable and readable."""
        return f"{self.tag}/{self.model}/{self.case_id}"

    @property
    def pp(self) -> int:
        return int(self.flags.get("pipeline_parallel", 1))

    @property
    def tp(self) -> int:
        return int(self.flags.get("tensor_parallel", 1))

    @property
    def vpp(self) -> int:
        return int(self.flags.get("virtual_pipeline_parallel", 1))

    @property
    def dp(self) -> int:
        return self.world_size // (self.pp * self.tp)

    @property
    def unsupported(self) -> tuple[str, ...]:
        return tuple(self.extra_flags)

    def reference_flags(self) -> dict[str, Any]:
        """The flags of this case's single-device reference run."""
        return {name: self.flags[name] for name in REFERENCE_FLAGS if name in self.flags}


@dataclass(frozen=True)
class HarnessConfig:
    path: Path
    variables: dict[str, Any]
    models: tuple[str, ...]
    model_files: dict[str, ModelFiles]
    assets: Assets
    trainer: TrainerSpec
    tags: tuple[str, ...]
    cases: tuple[Case, ...]

    def files_for(self, model: str) -> ModelFiles:
        return self.model_files.get(model, ModelFiles())
