"""Readers and writers for llm.c's checkpoint and token files (see checkpoint.py, tokens.py)."""

from ._binio import LlmcFormatError
from .checkpoint import (
    Checkpoint,
    CheckpointHeader,
    checkpoint_info,
    file_layout,
    file_order,
    parameter_shapes,
    read_checkpoint,
    read_checkpoint_header,
    write_checkpoint,
)
from .tokens import TokenHeader, read_tokens, read_tokens_header, write_tokens

__all__ = [
    "Checkpoint",
    "CheckpointHeader",
    "LlmcFormatError",
    "TokenHeader",
    "checkpoint_info",
    "file_layout",
    "file_order",
    "parameter_shapes",
    "read_checkpoint",
    "read_checkpoint_header",
    "read_tokens",
    "read_tokens_header",
    "write_checkpoint",
    "write_tokens",
]
