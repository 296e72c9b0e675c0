"""llm.c token files: read, validate, write.

As llm.c's dev/data/data_common.py ``write_datafile`` writes them: a 1024-byte header of 256
little-endian int32 (magic, version, num_tokens), then the tokens.

    GPT-2:   magic 20240520, version 1, uint16 tokens
    LLaMA 3: magic 20240801, version 7, uint32 tokens (the SPEC says int32: InfiniTrain loads
             them as int32, which is the same bytes while ids stay below 2**31, as
             write_tokens enforces)

A family may train on another's token files (tiny Mixtral on LLaMA 3's): the same magic names
one format, and a file of it reads as the first registered family's kind ("llama3").

Arrays come back in the file's own dtype (uint16 / uint32); convert to int64 for embedding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.contracts.models import MODEL_SPECS

from ._binio import HEADER_BYTES, LlmcFormatError, atomic_write, check_size, read_header


@dataclass(frozen=True)
class _TokenFormat:
    kind: str
    magic: int
    version: int
    dtype: str  # little-endian numpy dtype of one token
    max_id: int  # largest id the format can hold (and our readers accept)


# One format per registered model family (harness.contracts.models: token_magic / version / dtype).
FORMATS = {
    s.name: _TokenFormat(s.name, s.token_magic, s.token_version, s.token_dtype, s.token_max_id)
    for s in MODEL_SPECS.values()
}


def _formats_by_magic() -> dict[int, _TokenFormat]:
    """Each magic's format, named by the first family registered with it; families sharing a
    magic must share the whole format (else a file could not say how to read it)."""
    by_magic: dict[int, _TokenFormat] = {}
    for fmt in FORMATS.values():
        first = by_magic.setdefault(fmt.magic, fmt)
        if (first.version, first.dtype, first.max_id) != (fmt.version, fmt.dtype, fmt.max_id):
            raise ValueError(f"token magic {fmt.magic}: {fmt.kind}'s format (version "
                             f"{fmt.version}, {fmt.dtype}) differs from {first.kind}'s (version "
                             f"{first.version}, {first.dtype})")
    return by_magic


_BY_MAGIC = _formats_by_magic()


@dataclass(frozen=True)
class TokenHeader:
    path: Path
    kind: str  # "gpt2" | "llama3" (a format's first family: tiny Mixtral's files read as "llama3")
    version: int
    num_tokens: int
    dtype: np.dtype


def read_tokens_header(path: str | os.PathLike) -> TokenHeader:
    """Read and validate the header; checks the file's length is exactly what it claims."""
    path = Path(path)
    h, size = read_header(path)
    magic, version, n = int(h[0]), int(h[1]), int(h[2])
    fmt = _BY_MAGIC.get(magic)
    if fmt is None:
        known = ", ".join(f"{f.magic} ({f.kind})" for f in _BY_MAGIC.values())
        raise LlmcFormatError(path, f"bad magic {magic}: not an llm.c token file (known token "
                                    f"file magics: {known}; checkpoints use "
                                    f"{' / '.join(str(s.checkpoint_magic) for s in MODEL_SPECS.values())})")
    if version != fmt.version:
        raise LlmcFormatError(path, f"unsupported {fmt.kind} token file version {version} "
                                    f"(supported: {fmt.version})")
    if n <= 0:
        raise LlmcFormatError(path, f"header field num_tokens is {n}; it must be positive")
    itemsize = np.dtype(fmt.dtype).itemsize
    check_size(path, size, HEADER_BYTES + n * itemsize,
               f"{HEADER_BYTES}-byte header + {n} tokens of {itemsize} bytes")
    return TokenHeader(path, fmt.kind, version, n, np.dtype(fmt.dtype))


def check_token_ids(path, tokens: np.ndarray, vocab_size: int) -> None:
    """Refuse ids >= vocab_size, naming the first offending position and value."""
    bad = tokens >= vocab_size
    if bad.any():
        i = int(np.argmax(bad))
        raise LlmcFormatError(path, f"token id {int(tokens[i])} at index {i} is outside the "
                                    f"vocabulary (vocab_size {vocab_size}); "
                                    f"{int(bad.sum())} tokens are out of range")


def read_tokens(path: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray:
    """The file's tokens as a read-only memory map (uint16 for GPT-2, uint32 for LLaMA 3).
    With ``vocab_size``, every id is checked to be below it (one pass over the data)."""
    hdr = read_tokens_header(path)
    tokens = np.memmap(hdr.path, dtype=hdr.dtype, mode="r", offset=HEADER_BYTES,
                       shape=(hdr.num_tokens,))
    if vocab_size is not None:
        check_token_ids(hdr.path, tokens, vocab_size)
    return tokens


def write_tokens(path: str | os.PathLike, tokens, kind: str = "gpt2") -> Path:
    """Write a 1-D sequence of token ids in llm.c's format for ``kind`` (a registered family:
    "gpt2", "llama3", or "mixtral", which writes LLaMA 3's format)."""
    if kind not in FORMATS:
        raise ValueError(f"kind must be one of {sorted(FORMATS)}, got {kind!r}")
    fmt = FORMATS[kind]
    a = np.asarray(tokens)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {a.dtype}")
    if a.size >= 2**31:
        raise ValueError(f"{a.size} tokens do not fit the int32 num_tokens header field")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi > fmt.max_id:
        raise ValueError(f"token ids must lie in [0, {fmt.max_id}] for {kind} files, "
                         f"got min {lo}, max {hi}")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [fmt.magic, fmt.version, a.size]
    atomic_write(path, [header.tobytes(), a.astype(fmt.dtype).tobytes()])
    return Path(path)
