"""llm.c model checkpoints (GPT-2, LLaMA 3, Qwen3, tiny Mixtral): read, validate, write.

Layout, as llm.c's train_gpt2.py / train_llama3.py ``write_model`` and InfiniTrain's loaders use:
a 1024-byte header (256 little-endian int32), then every parameter tensor in a fixed order,
each *stacked over all layers* (all layers' ln_1.weight, then all layers' c_attn.weight, ...).
Version 3 stores float32, version 5 bfloat16 (read here and widened to float32).

tiny Mixtral (InfiniTrain feat/support_moe's own format, ``ModelSpec.layer_major``) stores its
per-layer tensors *layer by layer* instead (layer 0's ln_1, c_attn, ..., its experts, then
layer 1's ...), version 2, float32 only.

GPT-2 header:  magic 20240326, version, block_size, vocab_size, n_layer, n_head, n_embd,
               padded_vocab_size.
LLaMA 3 header: magic 20240803, version, block_size, vocab_size, n_layer, n_head, n_kv_head,
               n_embd, ffn_dim_multiplier (float32 bits), multiple_of, norm_eps (float32 bits),
               rope_theta (float32 bits), use_scaled_rope, max_gen_batch_size, version major,
               minor. This is InfiniTrain's reader layout (byte offsets 8..60). llm.c's own
               train_llama3.py stores the three float fields into an int32 tensor, truncating
               them (norm_eps becomes 0): such a file cannot be recovered and is refused.
Qwen3 header:  LLaMA 3's with magic 20240804, version 3 only, ffn_dim_multiplier 0.0; its
               tensors LLaMA 3's, with every layer's q_norm and k_norm (head_dim each) as
               pairs after the ln_1s (feat/add_Qwen3-8B@a3f84f8:example/qwen3/
               checkpoint_loader.cc).
tiny Mixtral header: magic 20260513, version 2, block_size, vocab_size, n_layer, n_head,
               n_kv_head, n_embd, num_experts, ffn_expansion_ratio (float32 bits), two unused
               slots (written 0), norm_eps, rope_theta (float32 bits), use_scaled_rope,
               router_topk, moe_ffn_hidden_size (feat/support_moe@b7e0760:
               example/tiny_mixtral/checkpoint_loader.cc:49-66).

The header's fields per family, and how each is checked, are the registry's
(``ModelSpec.header_fields``, harness.contracts.models); the tensor order is ``ModelSpec.tensor_layout``
(with ``ModelSpec.layer_major``), the versions ``ModelSpec.checkpoint_versions``.

In memory, tensors are unstacked and named per layer as docs/design.md fixes
(``h.{i}.attn.c_attn.weight``), so one name means one tensor on any pipeline stage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Union

import numpy as np

from harness.contracts.models import (
    CHECKPOINT_VERSIONS,
    HEADER_KINDS,
    GPT2_SPEC,
    LLAMA3_SPEC,
    MODEL_SPECS,
    GPT2Config,
    LLaMA3Config,
    MixtralConfig,
    Qwen3Config,
    UnknownModelError,
    spec_for_config,
)

from ._binio import HEADER_BYTES, LlmcFormatError, atomic_write, check_positive, check_size, read_header

GPT2_MAGIC = GPT2_SPEC.checkpoint_magic
LLAMA3_MAGIC = LLAMA3_SPEC.checkpoint_magic
# llm.c: 3 = all tensors float32, 5 = all tensors bfloat16 (GPT-2 and LLaMA 3; a family's own
# versions are its ModelSpec.checkpoint_versions).
VERSION_DTYPES = dict(CHECKPOINT_VERSIONS)
DTYPE_VERSIONS = {dtype: version for version, dtype in VERSION_DTYPES.items()}
_MODELS = {s.checkpoint_magic: s.name for s in MODEL_SPECS.values()}

ModelConfig = Union[GPT2Config, LLaMA3Config, Qwen3Config, MixtralConfig]


@dataclass(frozen=True)
class CheckpointHeader:
    path: Path
    model: str  # a family: "gpt2" | "llama3" | "qwen3" | "mixtral"
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

def _spec_of(config: ModelConfig):
    try:
        return spec_for_config(config)
    except UnknownModelError:
        expected = " or ".join(s.config.__name__ for s in MODEL_SPECS.values())
        raise TypeError(f"expected {expected}, got {type(config).__name__}") from None


def file_layout(config: ModelConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, per-layer shape, per layer?) in file order: the model family's
    ``ModelSpec.tensor_layout`` (harness.contracts.models)."""
    return _spec_of(config).tensor_layout(config)


def file_order(config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor's name (global layer index) and shape, in the order the file stores them:
    each per-layer tensor stacked over the layers (llm.c), a labelled group of them layer by
    layer (qwen3's q and k norms), or, for a ``layer_major`` family, layer 0's per-layer
    tensors, then layer 1's, ... For a stacked layout, tensor after tensor
    is the same bytes as llm.c's stacked arrays."""
    spec = _spec_of(config)
    layout = spec.tensor_layout(config)
    if not spec.layer_major:
        start = 0
        while start < len(layout):
            name, shape, per_layer = layout[start]
            if per_layer is False:
                yield name, shape
                start += 1
                continue
            # one tensor stacked over the layers, or a labelled group stored layer by layer
            end = start + 1
            while isinstance(per_layer, str) and end < len(layout) \
                    and layout[end][2] == per_layer:
                end += 1
            for i in range(config.n_layer):
                for name, shape, _ in layout[start:end]:
                    yield f"h.{i}.{name}", shape
            start = end
        return
    flags = [per_layer for _name, _shape, per_layer in layout]
    first = flags.index(True)
    end = first + flags[first:].index(False) if False in flags[first:] else len(flags)
    if any(flags[end:]):
        raise ValueError(f"{spec.name}: a layer-major layout needs its per-layer tensors in one "
                         f"run; {layout[end + flags[end:].index(True)][0]} comes after "
                         f"{layout[end][0]}")
    for name, shape, _ in layout[:first]:
        yield name, shape
    block = [(name, shape) for name, shape, _ in layout[first:end]]
    for i in range(config.n_layer):
        for name, shape in block:
            yield f"h.{i}.{name}", shape
    for name, shape, _ in layout[end:]:
        yield name, shape


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name (global layer index) and shape, in file order."""
    return dict(file_order(config))


def _num_parameters(config: ModelConfig) -> int:
    # Counted from the per-layer shapes, not by listing every layer: a damaged header may claim
    # 2**31 - 1 layers (or experts: the family's closed form), and the count must still be
    # instant (the file's length then refuses it).
    spec = _spec_of(config)
    if spec.parameter_count is not None:
        return spec.parameter_count(config)
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
    kind by kind (HEADER_KINDS order: every positive int, then the floats, ...); "unused"
    slots are not read, as the family's loader skips them."""
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
            elif want == "zero" and int(raw) != 0:
                raise LlmcFormatError(
                    path, f"header field {name} is {_f32(raw)!r} (int32 {int(raw)}); expected "
                          f"0.0: {spec.title}'s loader reads it but only 0 keeps its model the "
                          f"shape it loads (harness.contracts.models {spec.name} header_fields)")
    try:
        return spec.config(**values)
    except ValueError as e:  # inconsistent fields, e.g. n_embd not divisible by n_head
        raise LlmcFormatError(path, f"inconsistent header: {e}") from None


def _token_magics() -> list[str]:
    return list(dict.fromkeys(str(s.token_magic) for s in MODEL_SPECS.values()))


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
                                    f"{' / '.join(_token_magics())})")
    model = _MODELS[magic]
    spec = MODEL_SPECS[model]
    versions = dict(spec.checkpoint_versions)
    if version not in versions:
        known = ", ".join(f"{v} ({d})" for v, d in versions.items())
        raise LlmcFormatError(path, f"unsupported {model} checkpoint version {version} "
                                    f"(supported: {known})")
    config = _decode_config(path, spec, h)
    dtype = versions[version]
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
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in file_order(hdr.config):
        count = math.prod(shape)
        tensors[name] = data[offset:offset + count].reshape(shape)
        offset += count
    return Checkpoint(hdr.path, hdr.model, hdr.config, hdr.version, hdr.dtype, tensors)


def _encode_header(config: ModelConfig, version: int) -> bytes:
    spec = spec_for_config(config)
    h = np.zeros(256, dtype="<i4")
    h[0], h[1] = spec.checkpoint_magic, version
    for i, (name, kind) in enumerate(spec.header_fields):
        if kind in ("unused", "zero"):  # stays 0
            continue
        value = getattr(config, name)
        h[2 + i] = _f32_bits(value) if kind == "float32" else int(value)
    return h.tobytes()


def write_checkpoint(path: str | os.PathLike, config: ModelConfig,
                     tensors: Mapping[str, object], *, dtype: str = "float32") -> Path:
    """Write ``tensors`` (per-parameter names, arrays or CPU tensors) as an llm.c checkpoint;
    the format (GPT-2, LLaMA 3 or tiny Mixtral) follows the config's type. Names and shapes must
    match ``parameter_shapes(config)`` exactly."""
    spec = _spec_of(config)
    versions = {d: v for v, d in spec.checkpoint_versions}
    if dtype not in versions:
        raise ValueError(f"dtype must be one of {sorted(versions)} for {spec.name} "
                         f"checkpoints, got {dtype!r}")
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
        yield _encode_header(config, versions[dtype])
        for name in shapes:  # file order
            a = np.ascontiguousarray(arrays[name], dtype="<f4")
            yield (a if dtype == "float32" else _f32_to_bf16(a)).tobytes()

    atomic_write(path, chunks())
    return Path(path)
