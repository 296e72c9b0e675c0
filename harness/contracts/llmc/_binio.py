"""Shared low-level pieces of the llm.c file formats: the 1024-byte header and atomic writes.

Every llm.c file (checkpoints and token files alike) starts with 256 little-endian int32
values; the first is a magic number naming the format, the second a version.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class LlmcFormatError(ValueError):
    """A file that is not a valid llm.c checkpoint or token file; the message names the path."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def read_header(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Return (the 256 int32 header values, the file's size in bytes)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise LlmcFormatError(path, "no such file") from None
    except IsADirectoryError:
        raise LlmcFormatError(path, "is a directory, not an llm.c file") from None
    if len(raw) < HEADER_BYTES:
        raise LlmcFormatError(
            path, f"truncated header: the file is {len(raw)} bytes, an llm.c header alone is "
            f"{HEADER_BYTES} bytes (256 int32)"
        )
    return np.frombuffer(raw, dtype="<i4").copy(), size


def check_size(path: str | os.PathLike, actual: int, expected: int, what: str) -> None:
    """Refuse a file whose length is not exactly what its header implies (no silent short reads)."""
    if actual == expected:
        return
    if actual < expected:
        detail = f"truncated: {expected - actual} bytes missing"
    else:
        detail = f"{actual - expected} unexpected bytes after the data"
    raise LlmcFormatError(
        path, f"file is {actual} bytes but its header implies {expected} bytes ({what}); {detail}"
    )


def check_positive(path: str | os.PathLike, **fields: int) -> None:
    for name, value in fields.items():
        if value <= 0:
            raise LlmcFormatError(path, f"header field {name} is {value}; it must be positive")


def atomic_write(path: str | os.PathLike, chunks) -> None:
    """Write byte chunks to a temporary file then rename it into place, so a reader (or a
    concurrent generator) never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
