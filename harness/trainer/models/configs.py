"""Model hyper-parameters, as the llm.c checkpoint headers store them.

The dataclasses live with the families' torch-free contract in ``harness.spec.models``; this
module keeps the old import path.
"""

from __future__ import annotations

from harness.spec.models import GPT2Config, LLaMA3Config

__all__ = ["GPT2Config", "LLaMA3Config"]
