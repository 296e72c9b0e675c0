"""What GPT-2 and LLaMA 3 parts share: which pieces a part holds, a name-seeded init, and the
llm.c block names their parallel plans single out."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

import torch
from torch import nn

from harness.contracts.models import is_norm_gain


class ModelPart(nn.Module):
    """Base of GPT2 / LLaMA3: records which pieces of the model this part holds.

    ``layers`` are global layer indices (default: all), in order, no repeats; subclasses keep
    their blocks in ``self.h = nn.ModuleDict({str(i): ...})`` so names carry the global index.
    """

    def __init__(
        self,
        config,
        layers: Iterable[int] | None,
        embedding: bool,
        final_norm: bool,
        lm_head: bool,
    ):
        super().__init__()
        owner = type(self).__name__
        n_layer = config.n_layer
        indices = list(range(n_layer)) if layers is None else [int(i) for i in layers]
        for i in indices:
            if not 0 <= i < n_layer:
                raise ValueError(f"{owner}: layer index {i} is outside 0..{n_layer - 1}")
        if len(set(indices)) != len(indices):
            raise ValueError(f"{owner}: repeated layer indices in {indices}")
        self.config = config
        self.layer_indices = indices
        self.has_embedding = bool(embedding)
        self.has_final_norm = bool(final_norm)
        self.has_lm_head = bool(lm_head)

    @property
    def is_empty(self) -> bool:
        """An empty pipeline chunk: no embedding, layers, final norm or head."""
        return not (
            self.has_embedding or self.layer_indices or self.has_final_norm or self.has_lm_head
        )

    def check_length(self, T: int) -> None:
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Deterministic init: N(0, 0.02) matrices and embeddings, zero biases, unit norms.

        Each parameter draws from a generator seeded by (seed, its source name), so a part gets
        the same values as the same names in the whole model (GPT-2's ``lm_head.weight`` as
        ``wte.weight``).
        """
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif is_norm_gain(name):  # h.{i}.ln_1 / ln_2, ln_f; qwen3's attn.q_norm / k_norm
                p.fill_(1.0)
            else:
                g = named_generator(seed, self.source_name(name))
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(0.02))

    def source_name(self, name: str) -> str:
        """The tensor name a parameter is loaded from / reported under (itself by default)."""
        return name


def named_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded from (seed, parameter name)."""
    g = torch.Generator()
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


# Both families name their blocks as llm.c does (h.{i}.attn.c_attn, h.{i}.ln_1, ..., ln_f).
_FUSED_QKV = re.compile(r"h\.[^.]+\.attn\.c_attn\.[^.]+")
_SEQUENCE_NORM = re.compile(r"(h\.[^.]+\.ln_[12]|ln_f)\.[^.]+")


def is_fused_qkv(name: str) -> bool:
    """A parameter of a block's fused [q; k; v] projection, c_attn (its weight, its bias)."""
    return bool(_FUSED_QKV.fullmatch(name))


def is_sequence_norm(name: str) -> bool:
    """A parameter of a norm that runs on the sequence slice under SP: ln_1, ln_2, ln_f."""
    return bool(_SEQUENCE_NORM.fullmatch(name))


def no_parameter(name: str) -> bool:
    """The predicate that names no parameter (a family without such parameters)."""
    return False
