"""Sizes of the synthetic assets. Token ids are bytes of English text (< 128), so any
vocabulary of at least 256 holds them; larger vocabularies only make the head heavier."""

from __future__ import annotations

from dataclasses import dataclass

from harness.trainer.models.configs import GPT2Config, LLaMA3Config


@dataclass(frozen=True)
class Preset:
    name: str
    purpose: str
    gpt2: GPT2Config
    llama3: LLaMA3Config
    train_tokens: int
    val_tokens: int


def _llama3(n_layer, n_embd, n_head, n_kv_head, block_size, vocab_size, multiple_of):
    return LLaMA3Config(
        block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
        n_kv_head=n_kv_head, n_embd=n_embd, ffn_dim_multiplier=1.0, multiple_of=multiple_of,
        norm_eps=1e-5, rope_theta=10000.0, use_scaled_rope=True,
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        # 8 layers so pipeline layouts such as 4,4 / 2,6 / 4 stages / vpp 2 have room;
        # GPT-2's vocabulary is padded 256 -> 320 so the padded rows are exercised.
        Preset(
            "tiny", "CPU tests",
            GPT2Config(block_size=64, vocab_size=256, n_layer=8, n_head=4, n_embd=32,
                       padded_vocab_size=320),
            _llama3(8, 32, 4, 2, 64, 256, multiple_of=32),  # ffn 96
            train_tokens=64 * 1024, val_tokens=8 * 1024,
        ),
        Preset(
            "small", "quick GPU runs, deeper pipelines",
            GPT2Config(block_size=256, vocab_size=1000, n_layer=12, n_head=8, n_embd=128,
                       padded_vocab_size=1024),
            _llama3(12, 128, 8, 4, 256, 1024, multiple_of=64),  # ffn 384
            train_tokens=256 * 1024, val_tokens=16 * 1024,
        ),
        # A heavy head (vocab 8K against width 256) as real LMs have, for throughput and
        # pipeline-balancing benchmarks; GPT-2 pads 8000 -> 8064 like llm.c (multiple of 128).
        Preset(
            "bench", "throughput benchmarks",
            GPT2Config(block_size=256, vocab_size=8000, n_layer=8, n_head=8, n_embd=256,
                       padded_vocab_size=8064),
            _llama3(8, 256, 8, 4, 256, 8192, multiple_of=256),  # ffn 768
            train_tokens=1024 * 1024, val_tokens=64 * 1024,
        ),
    ]
}
