"""llm.c checkpoints: exact round trips, the byte layout llm.c / InfiniTrain read, and every
kind of bad file refused with the path and the reason."""

import math
import struct

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
from harness.contracts.models import GPT2Config, LLaMA3Config

# Odd sizes so that a transposed or misplaced tensor cannot keep its shape by accident.
GPT2 = GPT2Config(block_size=5, vocab_size=11, n_layer=3, n_head=2, n_embd=8, padded_vocab_size=16)
LLAMA3 = LLaMA3Config(block_size=7, vocab_size=13, n_layer=3, n_head=4, n_kv_head=2, n_embd=16,
                      ffn_dim_multiplier=1.3, multiple_of=8, norm_eps=1e-6, rope_theta=500000.0,
                      use_scaled_rope=True, max_gen_batch_size=4, version_major=3, version_minor=2)
CONFIGS = {"gpt2": GPT2, "llama3": LLAMA3}


def random_tensors(config, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in parameter_shapes(config).items()}


@pytest.fixture(params=["gpt2", "llama3"])
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
    assert (ckpt.model, ckpt.config, ckpt.version, ckpt.dtype) == (model, config, 3, "float32")
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


def test_bytes_are_in_llmc_order(written):
    model, config, tensors, path = written
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
    refused(path, "bad magic 12345", "20240326 (gpt2)", "20240803 (llama3)")


def test_token_file_given_as_checkpoint(tmp_path):
    path = write_tokens(tmp_path / "tokens.bin", np.arange(10), kind="gpt2")
    refused(path, "bad magic 20240520", "token files use")


@pytest.mark.parametrize("version", [1, 2, 4, 6, -3])
def test_unsupported_version(written, version):
    model, _, _, path = written
    rewrite_header(path, i1=version)
    refused(path, f"unsupported {model} checkpoint version {version}", "3 (float32)", "5 (bfloat16)")


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
                                        ("multiple_of", 9)]]


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
