"""harness.contracts.tolerance: a Tolerance is validated on construction."""

from __future__ import annotations

import math

import pytest

from harness.contracts.tolerance import Tolerance


@pytest.mark.parametrize("atol, rtol", [(-1, 0), (math.nan, 0), (0, math.inf), (True, 0)])
def test_tolerance_rejects_negative_and_non_finite(atol, rtol):
    with pytest.raises(ValueError, match="expected a finite number >= 0"):
        Tolerance(atol, rtol)
