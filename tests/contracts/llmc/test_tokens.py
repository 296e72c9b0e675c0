"""llm.c token files: round trips, the header llm.c writes, and bad files refused clearly."""

import struct

import numpy as np
import pytest

from harness.contracts.llmc import LlmcFormatError, read_tokens, read_tokens_header, write_tokens

# (kind, magic, version, on-disk dtype) as llm.c's dev/data/data_common.py writes them.
KINDS = [("gpt2", 20240520, 1, np.uint16), ("llama3", 20240801, 7, np.uint32)]


@pytest.fixture(params=KINDS, ids=[k[0] for k in KINDS])
def written(request, tmp_path):
    kind, magic, version, dtype = request.param
    tokens = np.random.default_rng(0).integers(0, 50000, size=1001)
    path = write_tokens(tmp_path / f"{kind}.bin", tokens, kind=kind)
    return kind, magic, version, dtype, tokens, path


def test_round_trip_is_exact(written):
    kind, magic, version, dtype, tokens, path = written
    got = read_tokens(path)
    assert got.dtype == dtype and not got.flags.writeable
    np.testing.assert_array_equal(got, tokens)
    header = read_tokens_header(path)
    assert (header.kind, header.version, header.num_tokens) == (kind, version, 1001)


def test_header_and_length_as_llmc_writes_them(written):
    _, magic, version, dtype, tokens, path = written
    raw = path.read_bytes()
    assert struct.unpack_from("<3i", raw) == (magic, version, len(tokens))
    assert not any(struct.unpack_from("<253i", raw, 12))
    assert len(raw) == 1024 + len(tokens) * np.dtype(dtype).itemsize
    np.testing.assert_array_equal(np.frombuffer(raw[1024:], dtype=dtype), tokens)


def test_largest_ids(tmp_path):
    path = write_tokens(tmp_path / "g.bin", [0, 65535], kind="gpt2")
    assert read_tokens(path).tolist() == [0, 65535]
    path = write_tokens(tmp_path / "l.bin", [128255, 2**31 - 1], kind="llama3")
    assert read_tokens(path).tolist() == [128255, 2**31 - 1]


def refused(path, *fragments, vocab_size=None):
    with pytest.raises(LlmcFormatError) as info:
        read_tokens(path, vocab_size=vocab_size)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def set_header(path, index, value):
    data = bytearray(path.read_bytes())
    struct.pack_into("<i", data, 4 * index, value)
    path.write_bytes(bytes(data))


def test_token_beyond_the_vocabulary_names_index_and_value(tmp_path):
    tokens = np.arange(300) % 250
    tokens[123] = 256
    tokens[200] = 300
    for kind in ("gpt2", "llama3"):
        path = write_tokens(tmp_path / f"{kind}.bin", tokens, kind=kind)
        refused(path, "token id 256 at index 123", "vocab_size 256", "2 tokens", vocab_size=256)
        assert read_tokens(path, vocab_size=301)[200] == 300


def test_wrong_magic(written):
    path = written[-1]
    set_header(path, 0, 20240326)
    refused(path, "bad magic 20240326", "20240520 (gpt2)", "20240801 (llama3)", "checkpoints use")


@pytest.mark.parametrize("version", [0, 2, 3, 5])
def test_unsupported_version(written, version):
    kind, _, supported, *_, path = written
    set_header(path, 1, version)
    refused(path, f"unsupported {kind} token file version {version}", f"supported: {supported}")


@pytest.mark.parametrize("num_tokens", [0, -5])
def test_non_positive_num_tokens(written, num_tokens):
    path = written[-1]
    set_header(path, 2, num_tokens)
    refused(path, f"num_tokens is {num_tokens}", "must be positive")


def test_num_tokens_disagreeing_with_length(written):
    *_, dtype, tokens, path = written
    itemsize = np.dtype(dtype).itemsize
    set_header(path, 2, len(tokens) - 1)  # claims fewer: the file has extra bytes
    refused(path, f"implies {1024 + (len(tokens) - 1) * itemsize} bytes", f"{itemsize} unexpected bytes")
    set_header(path, 2, len(tokens) + 10)  # claims more: truncated
    refused(path, "truncated", f"{10 * itemsize} bytes missing")


@pytest.mark.parametrize("keep", [0, 12, 1023, 1024, 1025, 2000])
def test_truncated_anywhere(written, keep):
    path = written[-1]
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    if keep < 1024:
        refused(path, "truncated header")
    else:
        refused(path, f"file is {keep} bytes", f"{len(data) - keep} bytes missing")


def test_missing_file(tmp_path):
    refused(tmp_path / "none.bin", "no such file")


@pytest.mark.parametrize("kind, tokens, reason", [
    ("gpt2", [1, 65536], r"\[0, 65535\]"),
    ("gpt2", [-1, 3], r"min -1"),
    ("llama3", [2**31], r"\[0, 2147483647\]"),
    ("gpt2", [], "non-empty"),
    ("gpt2", [[1, 2]], "1-D"),
    ("gpt2", [1.5], "integers"),
    ("gpt-2", [1], "kind must be"),
])
def test_writer_refuses_bad_input(tmp_path, kind, tokens, reason):
    with pytest.raises(ValueError, match=reason):
        write_tokens(tmp_path / "t.bin", np.array(tokens), kind=kind)
    assert not (tmp_path / "t.bin").exists()


def test_mixtral_trains_on_llama3_token_files(tmp_path):
    # tiny_mixtral reads LLaMA 3's files (feat/support_moe@b7e0760:example/common/
    # tiny_shakespeare_dataset.cc:27-30): writing for mixtral is writing LLaMA 3's format
    tokens = np.arange(300) * 401
    mixtral = write_tokens(tmp_path / "m.bin", tokens, kind="mixtral")
    llama3 = write_tokens(tmp_path / "l.bin", tokens, kind="llama3")
    assert mixtral.read_bytes() == llama3.read_bytes()
    assert read_tokens_header(mixtral).kind == "llama3"


def test_two_families_sharing_a_magic_must_share_the_format(monkeypatch):
    from harness.contracts.llmc import tokens as module

    clash = module._TokenFormat("clash", 20240801, 7, "<u2", 2**16 - 1)
    monkeypatch.setitem(module.FORMATS, "clash", clash)
    with pytest.raises(ValueError, match="token magic 20240801: clash's format \\(version 7, "
                                         "<u2\\) differs from llama3's \\(version 7, <u4\\)"):
        module._formats_by_magic()
