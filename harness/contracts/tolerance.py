"""The tolerance type: how far a run may be from the reference and still pass (torch-free).

Configs set it (harness.cases: defaults per dtype, per group, per case; re-exported there as
``harness.cases.Tolerance``) and the comparison applies it (harness.compare).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
