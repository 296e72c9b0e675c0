"""llm.c checkpoints: exact round trips, the byte layout llm.c / InfiniTrain read (tiny
Mixtral's layer by layer), and every kind of bad file refused with the path and the reason."""

import math
import struct
import time

import numpy as np
import pytest

from harness.contracts.llmc import (
    LlmcFormatError,
    checkpoint_info,
    parameter_shapes,
    read_checkpoint,
    read_checkpoint_header,
    write_checkpoint,
    write_tokens,
)
from harness.contracts.models import GPT2Config, LLaMA3Config, MixtralConfig

# Odd sizes so that a transposed or misplaced tensor cannot keep its shape by accident.
GPT2 = GPT2Config(block_size=5, vocab_size=11, n_layer=3, n_head=2, n_embd=8, padded_vocab_size=16)
LLAMA3 = LLaMA3Config(block_size=7, vocab_size=13, n_layer=3, n_head=4, n_kv_head=2, n_embd=16,
                      ffn_dim_multiplier=1.3, multiple_of=8, norm_eps=1e-6, rope_theta=500000.0,
                      use_scaled_rope=True, max_gen_batch_size=4, version_major=3, version_minor=2)
MIXTRAL = MixtralConfig(block_size=7, vocab_size=13, n_layer=3, n_head=4, n_kv_head=2, n_embd=16,
                        num_experts=3, ffn_expansion_ratio=2.5, norm_eps=1e-6, rope_theta=1e6,
                        use_scaled_rope=False, router_topk=2, moe_ffn_hidden_size=10)
CONFIGS = {"gpt2": GPT2, "llama3": LLAMA3, "mixtral": MIXTRAL}
VERSIONS = {"gpt2": 3, "llama3": 3, "mixtral": 2}  # what write_checkpoint writes for float32


def random_tensors(config, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in parameter_shapes(config).items()}


@pytest.fixture(params=["gpt2", "llama3", "mixtral"])
def written(request, tmp_path):
    """(model kind, config, tensors, path of a float32 checkpoint holding them)."""
    config = CONFIGS[request.param]
    tensors = random_tensors(config)
    path = write_checkpoint(tmp_path / f"{request.param}.bin", config, tensors)
    return request.param, config, tensors, path


@pytest.mark.parametrize("mmap", [False, True])
def test_round_trip_is_exact(written, mmap):
    model, config, tensors, path = written
    ckpt = read_checkpoint(path, mmap=mmap)
    assert (ckpt.model, ckpt.config, ckpt.version, ckpt.dtype) == \
        (model, config, VERSIONS[model], "float32")
    assert list(ckpt.tensors) == list(tensors)
    for name, value in tensors.items():
        assert ckpt.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(ckpt.tensors[name], value, err_msg=name)
    assert read_checkpoint_header(path) == (model, config)


def test_design_names_and_shapes():
    shapes = parameter_shapes(GPT2)
    assert shapes["wte.weight"] == (16, 8) and "lm_head.weight" not in shapes
    assert shapes["h.2.attn.c_attn.weight"] == (24, 8)
    assert shapes["h.0.mlp.c_proj.weight"] == (8, 32)
    shapes = parameter_shapes(LLAMA3)
    # hd = 4, kv = 2: [q 16 | k 8 | v 8]; ffn = round_up(int(1.3 * int(2 * 64 / 3)), 8) = 56
    assert shapes["h.1.attn.c_attn.weight"] == (32, 16)
    assert shapes["h.1.mlp.c_fc2.weight"] == (56, 16)
    assert shapes["h.1.mlp.c_proj.weight"] == (16, 56)
    assert shapes["lm_head.weight"] == (13, 16)


# The order llm.c's write_tensors uses, written out independently of file_layout().
STACK_ORDER = {
    "gpt2": (["wte.weight", "wpe.weight"],
             ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
              "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
              "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"],
             ["ln_f.weight", "ln_f.bias"]),
    "llama3": (["wte.weight"],
               ["ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
                "mlp.c_fc.weight", "mlp.c_fc2.weight", "mlp.c_proj.weight"],
               ["ln_f.weight", "lm_head.weight"]),
}


# tiny Mixtral's, layer by layer: feat/support_moe@b7e0760:example/tiny_mixtral/
# checkpoint_loader.cc:139-161 (experts' c_fc2, c_fc, c_proj: lines 155-157)
def mixtral_order(config):
    names = ["wte.weight"]
    for i in range(config.n_layer):
        names += [f"h.{i}.{n}" for n in ("ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight",
                                         "ln_2.weight", "mlp.router.weight")]
        for e in range(config.num_experts):
            names += [f"h.{i}.mlp.experts.expert_{e}.{n}.weight" for n in ("c_fc2", "c_fc", "c_proj")]
    return names + ["ln_f.weight", "lm_head.weight"]


def test_bytes_are_in_llmc_order(written):
    model, config, tensors, path = written
    if model == "mixtral":
        parts = [tensors[n] for n in mixtral_order(config)]
        assert list(parameter_shapes(config)) == mixtral_order(config)
    else:
        first, stacked, last = STACK_ORDER[model]
        parts = [tensors[n] for n in first]
        for name in stacked:
            parts += [tensors[f"h.{i}.{name}"] for i in range(config.n_layer)]
        parts += [tensors[n] for n in last]
    body = b"".join(np.ascontiguousarray(p, dtype="<f4").tobytes() for p in parts)
    assert path.read_bytes()[1024:] == body


def test_gpt2_header_fields(tmp_path):
    path = write_checkpoint(tmp_path / "g.bin", GPT2, random_tensors(GPT2))
    header = struct.unpack("<256i", path.read_bytes()[:1024])
    assert header[:8] == (20240326, 3, 5, 11, 3, 2, 8, 16)
    assert not any(header[8:])


def test_llama3_header_is_infinitrains_layout(tmp_path):
    path = write_checkpoint(tmp_path / "l.bin", LLAMA3, random_tensors(LLAMA3))
    raw = path.read_bytes()[:1024]
    assert struct.unpack_from("<8i", raw, 0) == (20240803, 3, 7, 13, 3, 4, 2, 16)
    f32 = lambda off: struct.unpack_from("<f", raw, off)[0]  # noqa: E731
    assert f32(32) == pytest.approx(1.3) and f32(40) == pytest.approx(1e-6)
    assert f32(44) == 500000.0
    assert struct.unpack_from("<i", raw, 36)[0] == 8
    assert struct.unpack_from("<4i", raw, 48) == (1, 4, 3, 2)


def test_mixtral_header_is_tiny_mixtrals_layout(tmp_path):
    # feat/support_moe@b7e0760:example/tiny_mixtral/checkpoint_loader.cc:45-66: int32 slots 0-8
    # and 14-16, float32 slots 9, 12, 13; slots 10 and 11 unused (written 0)
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    raw = path.read_bytes()[:1024]
    assert struct.unpack_from("<9i", raw, 0) == (20260513, 2, 7, 13, 3, 4, 2, 16, 3)
    f32 = lambda slot: struct.unpack_from("<f", raw, 4 * slot)[0]  # noqa: E731
    assert f32(9) == 2.5 and f32(12) == pytest.approx(1e-6) and f32(13) == 1e6
    assert struct.unpack_from("<2i", raw, 40) == (0, 0)
    assert struct.unpack_from("<3i", raw, 56) == (0, 2, 10)
    assert not any(struct.unpack_from("<239i", raw, 68))


def test_mixtral_unused_slots_are_not_read(tmp_path):
    # the loader skips slots 10 and 11 (checkpoint_loader.cc:57): whatever they hold, it loads
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    rewrite_header(path, i10=-7, i11=123456)
    assert read_checkpoint_header(path) == ("mixtral", MIXTRAL)


def test_mixtral_is_float32_only(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of \\['float32'\\] for mixtral "
                                         "checkpoints, got 'bfloat16'"):
        write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL), dtype="bfloat16")
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    rewrite_header(path, i1=5)  # llm.c's bfloat16 version is not tiny Mixtral's
    refused(path, "unsupported mixtral checkpoint version 5 (supported: 2 (float32))")


def test_mixtral_header_that_disagrees_with_the_size_is_one_line(tmp_path):
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    size = path.stat().st_size
    per_expert = 3 * 10 * 16  # c_fc2, c_fc, c_proj of width 10 over n_embd 16
    rewrite_header(path, i8=4)  # one expert more per layer than the data holds
    implied = size + 4 * 3 * (per_expert + 16)  # 3 layers, each with an expert and a router row
    message = refused(path)
    assert message == (f"{path}: file is {size} bytes but its header implies {implied} bytes "
                       f"(1024-byte header + {(implied - 1024) // 4} float32 parameters of 4 "
                       f"bytes); truncated: {implied - size} bytes missing")
    assert "\n" not in message
    # a damaged header claiming 2**31 - 1 experts is refused by the same arithmetic, at once
    rewrite_header(path, i8=2**31 - 1, i15=2)
    started = time.perf_counter()
    message = refused(path, f"file is {size} bytes but its header implies", "bytes missing")
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_bfloat16_version_5_is_read_as_float32(tmp_path, model):
    torch = pytest.importorskip("torch")
    config = CONFIGS[model]
    tensors = random_tensors(config)
    path = write_checkpoint(tmp_path / "bf16.bin", config, tensors, dtype="bfloat16")
    info = checkpoint_info(path)
    assert (info.version, info.dtype) == (5, "bfloat16")
    assert path.stat().st_size == 1024 + 2 * info.num_parameters
    ckpt = read_checkpoint(path)
    for name, value in tensors.items():
        expected = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(ckpt.tensors[name], expected, err_msg=name)


def test_writer_refuses_wrong_tensors(tmp_path):
    tensors = random_tensors(GPT2)
    missing = dict(tensors)
    del missing["h.1.ln_2.bias"]
    with pytest.raises(ValueError, match=r"missing \['h.1.ln_2.bias'\]"):
        write_checkpoint(tmp_path / "x.bin", GPT2, missing)
    with pytest.raises(ValueError, match="unexpected.*lm_head.weight"):
        write_checkpoint(tmp_path / "x.bin", GPT2, {**tensors, "lm_head.weight": tensors["wte.weight"]})
    with pytest.raises(ValueError, match=r"wpe.weight has shape \(8, 5\), expected \(5, 8\)"):
        write_checkpoint(tmp_path / "x.bin", GPT2, {**tensors, "wpe.weight": tensors["wpe.weight"].T})
    assert not (tmp_path / "x.bin").exists()


# --------------------------------------------------------------------------- bad files

def rewrite_header(path, **ints_at):
    """Overwrite int32 header slots given as i<index>=value (float: f<index>=value)."""
    data = bytearray(path.read_bytes())
    for key, value in ints_at.items():
        fmt = "<f" if key[0] == "f" else "<i"
        struct.pack_into(fmt, data, 4 * int(key[1:]), value)
    path.write_bytes(bytes(data))


def refused(path, *fragments):
    with pytest.raises(LlmcFormatError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    # The cheap header reader refuses the same file the same way.
    with pytest.raises(LlmcFormatError):
        read_checkpoint_header(path)
    return message


def test_wrong_magic_names_the_known_ones(written):
    _, _, _, path = written
    rewrite_header(path, i0=12345)
    refused(path, "bad magic 12345", "20240326 (gpt2)", "20240803 (llama3)",
            "20260513 (mixtral)", "token files use 20240520 / 20240801)")


def test_token_file_given_as_checkpoint(tmp_path):
    path = write_tokens(tmp_path / "tokens.bin", np.arange(10), kind="gpt2")
    refused(path, "bad magic 20240520", "token files use")


SUPPORTED = {"gpt2": ("3 (float32)", "5 (bfloat16)"), "llama3": ("3 (float32)", "5 (bfloat16)"),
             "mixtral": ("2 (float32)",)}


@pytest.mark.parametrize("version", [1, 2, 4, 6, -3])
def test_unsupported_version(written, version):
    model, _, _, path = written
    if version == VERSIONS[model]:
        version = 3  # llm.c's float32 version: not tiny Mixtral's
    rewrite_header(path, i1=version)
    refused(path, f"unsupported {model} checkpoint version {version}", *SUPPORTED[model])


def test_extra_bytes_after_the_data(written):
    _, _, _, path = written
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\0" * 12)
    refused(path, f"file is {size + 12} bytes", f"implies {size} bytes", "12 unexpected bytes")


def test_header_that_disagrees_with_the_length(written):
    model, config, _, path = written
    rewrite_header(path, i4=config.n_layer + 1)  # one layer more than the data holds
    refused(path, "truncated", "bytes missing", "implies")


@pytest.mark.parametrize("keep", [0, 3, 1023, 1024, 1028, "half", "all-but-one"])
def test_truncated_anywhere(written, keep):
    _, _, _, path = written
    data = path.read_bytes()
    n = {"half": len(data) // 2, "all-but-one": len(data) - 1}.get(keep, keep)
    path.write_bytes(data[:n])
    if n < 1024:
        refused(path, "truncated header", f"file is {n} bytes")
    else:
        refused(path, f"file is {n} bytes", f"{len(data) - n} bytes missing")


# (model, header field, int32 slot) for every integer field that must be positive.
INT_FIELDS = [("gpt2", f, 2 + i) for i, f in enumerate(
    ["block_size", "vocab_size", "n_layer", "n_head", "n_embd", "padded_vocab_size"])] + [
    ("llama3", f, slot) for f, slot in [("block_size", 2), ("vocab_size", 3), ("n_layer", 4),
                                        ("n_head", 5), ("n_kv_head", 6), ("n_embd", 7),
                                        ("multiple_of", 9)]] + [
    ("mixtral", f, slot) for f, slot in [("block_size", 2), ("vocab_size", 3), ("n_layer", 4),
                                         ("n_head", 5), ("n_kv_head", 6), ("n_embd", 7),
                                         ("num_experts", 8), ("router_topk", 15),
                                         ("moe_ffn_hidden_size", 16)]]


@pytest.mark.parametrize("value", [0, -4])
@pytest.mark.parametrize("model, field, slot", INT_FIELDS)
def test_non_positive_int_fields(tmp_path, model, field, slot, value):
    config = CONFIGS[model]
    path = write_checkpoint(tmp_path / "c.bin", config, random_tensors(config))
    rewrite_header(path, **{f"i{slot}": value})
    refused(path, f"header field {field} is {value}", "must be positive")


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("field, slot", [("ffn_dim_multiplier", 8), ("norm_eps", 10),
                                         ("rope_theta", 11)])
def test_llama3_bad_float_fields(tmp_path, field, slot, value):
    path = write_checkpoint(tmp_path / "l.bin", LLAMA3, random_tensors(LLAMA3))
    rewrite_header(path, **{f"f{slot}": value})
    refused(path, f"header field {field} is", "positive, finite, normal float32")


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("field, slot", [("ffn_expansion_ratio", 9), ("norm_eps", 12),
                                         ("rope_theta", 13)])
def test_mixtral_bad_float_fields(tmp_path, field, slot, value):
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    rewrite_header(path, **{f"f{slot}": value})
    refused(path, f"header field {field} is", "positive, finite, normal float32")


def test_mixtral_inconsistent_fields(tmp_path):
    path = write_checkpoint(tmp_path / "m.bin", MIXTRAL, random_tensors(MIXTRAL))
    rewrite_header(path, i15=4)  # top 4 of 3 experts
    refused(path, "inconsistent header", "router_topk=4 exceeds num_experts=3")
    rewrite_header(path, i15=2, i14=1)  # config.h:61: scaled RoPE stays off
    refused(path, "inconsistent header", "use_scaled_rope is True")
    rewrite_header(path, i14=2)
    refused(path, "use_scaled_rope is 2")


def test_llama3_header_from_llmc_train_llama3_py_is_explained(tmp_path):
    # llm.c's train_llama3.py assigns the float fields into an int32 tensor: 1.3 -> 1,
    # 1e-5 -> 0, 500000.0 -> 500000.
    path = write_checkpoint(tmp_path / "l.bin", LLAMA3, random_tensors(LLAMA3))
    rewrite_header(path, i8=1, i10=0, i11=500000)
    refused(path, "ffn_dim_multiplier", "raw int32 is 1", "looks like an integer", "train_llama3.py")
    rewrite_header(path, f8=1.3, f10=1e-5)  # only rope_theta truncated
    refused(path, "rope_theta", "raw int32 is 500000", "looks like an integer")


def test_llama3_other_bad_fields(tmp_path):
    path = write_checkpoint(tmp_path / "l.bin", LLAMA3, random_tensors(LLAMA3))
    rewrite_header(path, i12=2)
    refused(path, "use_scaled_rope is 2")
    rewrite_header(path, i12=1, i13=-1)
    refused(path, "max_gen_batch_size is -1")


def test_inconsistent_fields(tmp_path):
    path = write_checkpoint(tmp_path / "g.bin", GPT2, random_tensors(GPT2))
    rewrite_header(path, i5=3)  # n_embd 8 is not divisible by 3 heads
    refused(path, "inconsistent header", "not divisible by n_head=3")
    rewrite_header(path, i5=2, i7=10)  # padded_vocab_size < vocab_size
    refused(path, "inconsistent header", "smaller than vocab_size")


def test_missing_file_and_directory(tmp_path):
    refused(tmp_path / "nope.bin", "no such file")
    refused(tmp_path, "is a directory")
