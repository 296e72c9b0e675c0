"""llm.c model checkpoints (GPT-2 and LLaMA 3): read, validate, write.

Layout, as llm.c's train_gpt2.py / train_llama3.py ``write_model`` and InfiniTrain's loaders use:
a 1024-byte header (256 little-endian int32), then every parameter tensor in a fixed order,
each *stacked over all layers* (all layers' ln_1.weight, then all layers' c_attn.weight, ...).
Version 3 stores float32, version 5 bfloat16 (read here and widened to float32).

GPT-2 header:  magic 20240326, version, block_size, vocab_size, n_layer, n_head, n_embd,
               padded_vocab_size.
LLaMA 3 header: magic 20240803, version, block_size, vocab_size, n_layer, n_head, n_kv_head,
               n_embd, ffn_dim_multiplier (float32 bits), multiple_of, norm_eps (float32 bits),
               rope_theta (float32 bits), use_scaled_rope, max_gen_batch_size, version major,
               minor. This is InfiniTrain's reader layout (byte offsets 8..60). llm.c's own
               train_llama3.py stores the three float fields into an int32 tensor, truncating
               them (norm_eps becomes 0): such a file cannot be recovered and is refused.

The header's fields per family, and how each is checked, are the registry's
(``ModelSpec.header_fields``, harness.contracts.models); the tensor order is ``ModelSpec.tensor_layout``.

In memory, tensors are unstacked and named per layer as docs/design.md fixes
(``h.{i}.attn.c_attn.weight``), so one name means one tensor on any pipeline stage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

import numpy as np

from harness.contracts.models import (
    CHECKPOINT_VERSIONS,
    HEADER_KINDS,
    GPT2_SPEC,
    LLAMA3_SPEC,
    MODEL_SPECS,
    GPT2Config,
    LLaMA3Config,
    UnknownModelError,
    spec_for_config,
)

from ._binio import HEADER_BYTES, LlmcFormatError, atomic_write, check_positive, check_size, read_header

GPT2_MAGIC = GPT2_SPEC.checkpoint_magic
LLAMA3_MAGIC = LLAMA3_SPEC.checkpoint_magic
# llm.c: 3 = all tensors float32, 5 = all tensors bfloat16 (both models).
VERSION_DTYPES = dict(CHECKPOINT_VERSIONS)
DTYPE_VERSIONS = {dtype: version for version, dtype in VERSION_DTYPES.items()}
_MODELS = {s.checkpoint_magic: s.name for s in MODEL_SPECS.values()}

ModelConfig = Union[GPT2Config, LLaMA3Config]


@dataclass(frozen=True)
class CheckpointHeader:
    path: Path
    model: str  # "gpt2" | "llama3"
    config: ModelConfig
    version: int
    dtype: str  # how the file stores tensors: "float32" | "bfloat16"
    num_parameters: int  # float count after the header (GPT-2: wte has padded_vocab_size rows)


@dataclass
class Checkpoint:
    path: Path
    model: str
    config: ModelConfig
    version: int
    dtype: str
    # Per-parameter name -> float32 array, in file order (names as in docs/design.md).
    tensors: dict[str, np.ndarray] = field(repr=False)


# --------------------------------------------------------------------------- tensor layout

def file_layout(config: ModelConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, per-layer shape, stacked over layers?) in file order: the model family's
    ``ModelSpec.tensor_layout`` (harness.contracts.models)."""
    try:
        spec = spec_for_config(config)
    except UnknownModelError:
        expected = " or ".join(s.config.__name__ for s in MODEL_SPECS.values())
        raise TypeError(f"expected {expected}, got {type(config).__name__}") from None
    return spec.tensor_layout(config)


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name (global layer index) and shape, in file order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape, stacked in file_layout(config):
        if stacked:
            for i in range(config.n_layer):
                shapes[f"h.{i}.{name}"] = shape
        else:
            shapes[name] = shape
    return shapes


def _num_parameters(config: ModelConfig) -> int:
    # Counted from the per-layer shapes, not by listing every layer: a damaged header may claim
    # 2**31 - 1 layers, and the count must still be instant (the file's length then refuses it).
    return sum(math.prod(shape) * (config.n_layer if stacked else 1)
               for _, shape, stacked in file_layout(config))


# --------------------------------------------------------------------------- header

def _f32(bits: np.int32) -> float:
    """Decode a float32 header field to the shortest decimal that round-trips (1e-05, not
    9.99999974e-06): the same float32 either way, and configs compare equal after a round trip."""
    return float(str(np.array(bits, dtype="<i4").view("<f4")))


def _f32_bits(value: float) -> np.int32:
    return np.array(value, dtype="<f4").view("<i4")


def _check_float_field(path, name: str, bits: np.int32, value: float) -> None:
    # Subnormal values are refused too: they are what small integers look like as float32 bits.
    if math.isfinite(value) and value >= np.finfo(np.float32).tiny:
        return
    hint = ""
    if 0 <= int(bits) < (1 << 23):
        hint = (f" (the raw int32 is {int(bits)}: it looks like an integer, as llm.c's "
                "train_llama3.py writes when it stores float fields into its int32 header; "
                "this reader expects float32 bit patterns, InfiniTrain's layout)")
    raise LlmcFormatError(path, f"header field {name} is {value!r}; it must be a positive, "
                                f"finite, normal float32{hint}")


def _decode_config(path, spec, h: np.ndarray) -> ModelConfig:
    """The config from the header slots the family's ``ModelSpec.header_fields`` name, checked
    kind by kind (HEADER_KINDS order: every positive int, then the floats, ...)."""
    slots = {name: (kind, h[2 + i]) for i, (name, kind) in enumerate(spec.header_fields)}
    values: dict = {}
    for want in HEADER_KINDS:
        fields = {name: raw for name, (kind, raw) in slots.items() if kind == want}
        if want == "positive":
            values.update({name: int(raw) for name, raw in fields.items()})
            check_positive(path, **{name: values[name] for name in fields})
        for name, raw in fields.items():
            if want == "float32":
                values[name] = _f32(raw)
                _check_float_field(path, name, raw, values[name])
            elif want == "bool":
                if int(raw) not in (0, 1):
                    raise LlmcFormatError(path, f"header field {name} is {int(raw)}; "
                                                "expected 0 or 1")
                values[name] = bool(raw)
            elif want in ("count", "int"):
                if want == "count" and int(raw) < 0:
                    raise LlmcFormatError(path, f"header field {name} is {int(raw)}; "
                                                "it must not be negative")
                values[name] = int(raw)
    try:
        return spec.config(**values)
    except ValueError as e:  # inconsistent fields, e.g. n_embd not divisible by n_head
        raise LlmcFormatError(path, f"inconsistent header: {e}") from None


def read_checkpoint_header(path: str | os.PathLike) -> tuple[str, ModelConfig]:
    """(model kind, config) from the header alone (cheap), after the same validation as
    ``read_checkpoint``, the file's exact length included."""
    info = checkpoint_info(path)
    return info.model, info.config


def checkpoint_info(path: str | os.PathLike) -> CheckpointHeader:
    """Read and validate the header only: model kind, config, version, stored dtype, and that
    the file's length is exactly what the header implies."""
    path = Path(path)
    h, size = read_header(path)
    magic, version = int(h[0]), int(h[1])
    if magic not in _MODELS:
        known = ", ".join(f"{m} ({k})" for m, k in _MODELS.items())
        raise LlmcFormatError(path, f"bad magic {magic}: not an llm.c checkpoint (known checkpoint "
                                    f"magics: {known}; token files use "
                                    f"{' / '.join(str(s.token_magic) for s in MODEL_SPECS.values())})")
    model = _MODELS[magic]
    if version not in VERSION_DTYPES:
        known = ", ".join(f"{v} ({d})" for v, d in VERSION_DTYPES.items())
        raise LlmcFormatError(path, f"unsupported {model} checkpoint version {version} "
                                    f"(supported: {known})")
    config = _decode_config(path, MODEL_SPECS[model], h)
    dtype = VERSION_DTYPES[version]
    n = _num_parameters(config)
    itemsize = 4 if dtype == "float32" else 2
    check_size(path, size, HEADER_BYTES + n * itemsize,
               f"{HEADER_BYTES}-byte header + {n} {dtype} parameters of {itemsize} bytes")
    return CheckpointHeader(path, model, config, version, dtype, n)


# --------------------------------------------------------------------------- read / write

def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch's .to(torch.bfloat16) does (NaN payloads aside)."""
    bits = x.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def read_checkpoint(path: str | os.PathLike, *, mmap: bool = False) -> Checkpoint:
    """Read a whole checkpoint. Tensors are float32; with ``mmap=True`` (float32 files only)
    they are read-only views into a memory map instead of in-memory copies."""
    hdr = checkpoint_info(path)
    n = hdr.num_parameters
    if hdr.dtype == "float32" and mmap:
        data = np.memmap(hdr.path, dtype="<f4", mode="r", offset=HEADER_BYTES, shape=(n,))
    else:
        raw = np.fromfile(hdr.path, dtype="<f4" if hdr.dtype == "float32" else "<u2",
                          count=n, offset=HEADER_BYTES)
        if raw.size != n:  # the file shrank after the header check
            raise LlmcFormatError(hdr.path, f"truncated: read {raw.size} of {n} parameters")
        data = raw if hdr.dtype == "float32" else _bf16_to_f32(raw)
    L = hdr.config.n_layer
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape, stacked in file_layout(hdr.config):
        count = math.prod(shape) * (L if stacked else 1)
        block = data[offset:offset + count]
        offset += count
        if stacked:
            block = block.reshape((L,) + shape)
            for i in range(L):
                tensors[f"h.{i}.{name}"] = block[i]
        else:
            tensors[name] = block.reshape(shape)
    return Checkpoint(hdr.path, hdr.model, hdr.config, hdr.version, hdr.dtype, tensors)


def _encode_header(config: ModelConfig, version: int) -> bytes:
    spec = spec_for_config(config)
    h = np.zeros(256, dtype="<i4")
    h[0], h[1] = spec.checkpoint_magic, version
    for i, (name, kind) in enumerate(spec.header_fields):
        value = getattr(config, name)
        h[2 + i] = _f32_bits(value) if kind == "float32" else int(value)
    return h.tobytes()


def write_checkpoint(path: str | os.PathLike, config: ModelConfig,
                     tensors: Mapping[str, object], *, dtype: str = "float32") -> Path:
    """Write ``tensors`` (per-parameter names, arrays or CPU tensors) as an llm.c checkpoint;
    the format (GPT-2 or LLaMA 3) follows the config's type. Names and shapes must match
    ``parameter_shapes(config)`` exactly."""
    if dtype not in DTYPE_VERSIONS:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_VERSIONS)}, got {dtype!r}")
    shapes = parameter_shapes(config)
    missing = [k for k in shapes if k not in tensors]
    extra = [k for k in tensors if k not in shapes]
    if missing or extra:
        raise ValueError(f"tensors do not match the {type(config).__name__} parameters: "
                         f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                         f"unexpected {extra[:8]}{'...' if len(extra) > 8 else ''}")
    arrays = {}
    for name, shape in shapes.items():
        a = np.asarray(tensors[name], dtype=np.float32)
        if a.shape != shape:
            raise ValueError(f"tensor {name} has shape {a.shape}, expected {shape}")
        arrays[name] = a

    def chunks():
        yield _encode_header(config, DTYPE_VERSIONS[dtype])
        for name, _, stacked in file_layout(config):
            if stacked:
                a = np.stack([arrays[f"h.{i}.{name}"] for i in range(config.n_layer)])
            else:
                a = arrays[name]
            a = np.ascontiguousarray(a, dtype="<f4")
            yield (a if dtype == "float32" else _f32_to_bf16(a)).tobytes()

    atomic_write(path, chunks())
    return Path(path)
