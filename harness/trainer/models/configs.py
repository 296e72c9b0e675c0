"""Model hyper-parameters, as the llm.c checkpoint headers store them.

Plain dataclasses with no torch import, so a checkpoint header can be read and checked
without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


def _require_positive(owner: str, **fields: int) -> None:
    for name, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} is {value!r}; expected a positive integer")


@dataclass(frozen=True)
class GPT2Config:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    padded_vocab_size: int

    def __post_init__(self) -> None:
        _require_positive(
            "GPT2Config",
            block_size=self.block_size,
            vocab_size=self.vocab_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            padded_vocab_size=self.padded_vocab_size,
        )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT2Config.n_embd={self.n_embd} is not divisible by n_head={self.n_head}"
            )
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"GPT2Config.padded_vocab_size={self.padded_vocab_size} is smaller than "
                f"vocab_size={self.vocab_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class LLaMA3Config:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_dim_multiplier: float = 1.3
    multiple_of: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = True
    max_gen_batch_size: int = 4
    version_major: int = 3
    version_minor: int = 1

    def __post_init__(self) -> None:
        _require_positive(
            "LLaMA3Config",
            block_size=self.block_size,
            vocab_size=self.vocab_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_kv_head=self.n_kv_head,
            n_embd=self.n_embd,
            multiple_of=self.multiple_of,
        )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"LLaMA3Config.n_embd={self.n_embd} is not divisible by n_head={self.n_head}"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"LLaMA3Config.n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"LLaMA3Config.norm_eps is {self.norm_eps!r}; expected > 0")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """Hidden size of the SwiGLU MLP, as Meta's and llm.c's code derive it."""
        hidden = int(2 * 4 * self.n_embd / 3)
        hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)
