"""Damaged llm.c files: every truncation point of a small checkpoint and token file, and fuzzed
header fields, give LlmcFormatError naming the file; never another exception, never a
successful read of a short file."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.contracts.llmc import (
    LlmcFormatError,
    checkpoint_info,
    parameter_shapes,
    read_checkpoint,
    read_checkpoint_header,
    read_tokens,
    read_tokens_header,
    write_checkpoint,
    write_tokens,
)
from harness.contracts.models import MixtralConfig
from harness.trainer.models.configs import GPT2Config, LLaMA3Config

# As small as the formats allow, so that every byte can be a truncation point.
CONFIGS = {
    "gpt2": GPT2Config(block_size=2, vocab_size=3, n_layer=1, n_head=1, n_embd=4,
                       padded_vocab_size=4),
    "llama3": LLaMA3Config(block_size=2, vocab_size=3, n_layer=2, n_head=2, n_kv_head=1,
                           n_embd=4, ffn_dim_multiplier=1.0, multiple_of=4, norm_eps=1e-5,
                           rope_theta=10000.0, use_scaled_rope=False, max_gen_batch_size=1,
                           version_major=3, version_minor=2),
    "mixtral": MixtralConfig(block_size=2, vocab_size=3, n_layer=2, n_head=2, n_kv_head=1,
                             n_embd=4, num_experts=2, router_topk=1, moe_ffn_hidden_size=2),
}
NORM_EPS_SLOT = {"llama3": 10, "mixtral": 12}  # a float32 header slot


def small_checkpoint(tmp_path, model):
    config = CONFIGS[model]
    rng = np.random.default_rng(0)
    tensors = {k: rng.standard_normal(s).astype(np.float32)
               for k, s in parameter_shapes(config).items()}
    return write_checkpoint(tmp_path / f"{model}.bin", config, tensors)


def refused(read, path):
    with pytest.raises(LlmcFormatError) as info:
        read(path)
    assert str(path) in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_every_truncation_of_a_checkpoint_is_refused(tmp_path, model):
    path = small_checkpoint(tmp_path, model)
    data = path.read_bytes()
    assert len(data) < 3000  # small enough to try every byte
    read_checkpoint(path)  # the whole file reads
    short = tmp_path / "short.bin"
    readers = (read_checkpoint_header, checkpoint_info, read_checkpoint,
               lambda p: read_checkpoint(p, mmap=True))
    for keep in range(len(data)):
        short.write_bytes(data[:keep])
        for read in readers:
            message = refused(read, short)
            assert "truncated" in message or "bytes" in message, (keep, message)


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_every_truncation_of_a_token_file_is_refused(tmp_path, model):
    path = write_tokens(tmp_path / "tokens.bin", list(range(40)) * 3, kind=model)
    data = path.read_bytes()
    read_tokens(path, vocab_size=40)
    short = tmp_path / "short.bin"
    for keep in range(len(data)):
        short.write_bytes(data[:keep])
        refused(read_tokens_header, short)
        refused(lambda p: read_tokens(p, vocab_size=40), short)


INT32 = st.one_of(st.integers(-3, 70), st.sampled_from([2**31 - 1, -2**31, 2**30, 1 << 20]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(sorted(CONFIGS)),
       changes=st.lists(st.tuples(st.integers(0, 20), INT32), min_size=1, max_size=3),
       float_bits=st.one_of(st.none(), st.sampled_from([0x7FC00000, 0x7F800000, 0xFF800000, 0,
                                                       0x80000000, 0x3F800000])))
def test_fuzzed_checkpoint_headers(tmp_path, model, changes, float_bits):
    """Random int32 values in the header's slots (and NaN / inf / 0 in a float slot): the
    read succeeds only with a header that fits the data, otherwise LlmcFormatError."""
    path = tmp_path / f"fuzz-{model}.bin"
    if not path.exists():
        small_checkpoint(tmp_path, model).rename(path)
    data = bytearray(path.read_bytes())
    original = bytes(data)
    try:
        for slot, value in changes:
            struct.pack_into("<i", data, 4 * slot, value)
        if float_bits is not None and model in NORM_EPS_SLOT:
            struct.pack_into("<I", data, 4 * NORM_EPS_SLOT[model], float_bits)
        path.write_bytes(bytes(data))
        for read in (read_checkpoint_header, read_checkpoint):
            try:
                read(path)
            except LlmcFormatError as error:
                assert str(path) in str(error)
    finally:
        path.write_bytes(original)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot=st.integers(0, 5), value=INT32, vocab=st.sampled_from([None, 3, 40, 70000]))
def test_fuzzed_token_headers(tmp_path, slot, value, vocab):
    path = write_tokens(tmp_path / "t.bin", list(range(40)) * 2, kind="gpt2")
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 4 * slot, value)
    path.write_bytes(bytes(data))
    try:
        tokens = read_tokens(path, vocab_size=vocab)
    except LlmcFormatError as error:
        assert str(path) in str(error)
    else:
        assert len(tokens) >= 1
