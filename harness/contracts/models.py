"""The model families' torch-free contract: one ``ModelSpec`` per family, and nothing that imports torch.

A spec is what the harness side (cases, assets, the llm.c readers, the comparison) and the
trainer both need to know about a family, as data:

- its config dataclass (the llm.c header's hyper-parameters; defined here, torch-free);
- its llm.c file formats: checkpoint magic, header fields and tensor order, token-file
  magic / version / dtype;
- its tied parameters (GPT-2: ``wte.weight`` is also the head, ``lm_head.weight`` on a part
  without the embedding), and the name -> global layer rule the comparison's locator uses;
- the sizes of its synthetic assets per preset.

The torch side of a family (its module, names = checkpoint keys, and its parallelize plan,
written as code) is ``harness/trainer/models/<family>/``, registered there as a ``TrainSpec``
that holds this spec (docs/design.md, "Adding a model family").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

# ------------------------------------------------------------------------------- configs


def _require_positive(owner: str, **fields: int) -> None:
    for name, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} is {value!r}; expected a positive integer")


@dataclass(frozen=True)
class GPT2Config:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    padded_vocab_size: int

    def __post_init__(self) -> None:
        _require_positive(
            "GPT2Config",
            block_size=self.block_size,
            vocab_size=self.vocab_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            padded_vocab_size=self.padded_vocab_size,
        )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT2Config.n_embd={self.n_embd} is not divisible by n_head={self.n_head}"
            )
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"GPT2Config.padded_vocab_size={self.padded_vocab_size} is smaller than "
                f"vocab_size={self.vocab_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Key/value heads: one per query head (GPT-2 has no grouped-query attention)."""
        return self.n_head

    @property
    def ffn_dim(self) -> int:
        """Hidden size of the MLP: 4 * n_embd, as GPT-2 has it."""
        return 4 * self.n_embd


@dataclass(frozen=True)
class LLaMA3Config:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_dim_multiplier: float = 1.3
    multiple_of: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = True
    max_gen_batch_size: int = 4
    version_major: int = 3
    version_minor: int = 1

    def __post_init__(self) -> None:
        _require_positive(
            "LLaMA3Config",
            block_size=self.block_size,
            vocab_size=self.vocab_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_kv_head=self.n_kv_head,
            n_embd=self.n_embd,
            multiple_of=self.multiple_of,
        )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"LLaMA3Config.n_embd={self.n_embd} is not divisible by n_head={self.n_head}"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"LLaMA3Config.n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"LLaMA3Config.norm_eps is {self.norm_eps!r}; expected > 0")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """Hidden size of the SwiGLU MLP, as Meta's and llm.c's code derive it."""
        hidden = int(2 * 4 * self.n_embd / 3)
        hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


# ------------------------------------------------------------------------------- llm.c layouts

Layout = list  # [(name, per-layer shape, stacked over layers?), ...] in file order


def _gpt2_tensor_layout(config: GPT2Config) -> Layout:
    C = config.n_embd
    per_layer = [
        ("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
        ("attn.c_attn.weight", (3 * C, C)), ("attn.c_attn.bias", (3 * C,)),
        ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
        ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
        ("mlp.c_fc.weight", (4 * C, C)), ("mlp.c_fc.bias", (4 * C,)),
        ("mlp.c_proj.weight", (C, 4 * C)), ("mlp.c_proj.bias", (C,)),
    ]
    head = [("wte.weight", (config.padded_vocab_size, C), False),
            ("wpe.weight", (config.block_size, C), False)]
    tail = [("ln_f.weight", (C,), False), ("ln_f.bias", (C,), False)]
    return head + [(name, shape, True) for name, shape in per_layer] + tail


def _llama3_tensor_layout(config: LLaMA3Config) -> Layout:
    C = config.n_embd
    qkv = C + 2 * config.n_kv_head * config.head_dim
    ffn = config.ffn_dim
    per_layer = [
        ("ln_1.weight", (C,)),
        ("attn.c_attn.weight", (qkv, C)),
        ("attn.c_proj.weight", (C, C)),
        ("ln_2.weight", (C,)),
        ("mlp.c_fc.weight", (ffn, C)),
        ("mlp.c_fc2.weight", (ffn, C)),
        ("mlp.c_proj.weight", (C, ffn)),
    ]
    head = [("wte.weight", (config.vocab_size, C), False)]
    tail = [("ln_f.weight", (C,), False), ("lm_head.weight", (config.vocab_size, C), False)]
    return head + [(name, shape, True) for name, shape in per_layer] + tail


# The llm.c checkpoint header after (magic, version): one int32 slot per config field, in order.
# How a slot is stored and checked when read:
#   "positive"  an int32 > 0;          "count"  an int32 >= 0;     "int"  an int32 as stored;
#   "float32"   float32 bits (positive, finite, normal);            "bool" 0 or 1.
HEADER_KINDS = ("positive", "float32", "bool", "count", "int")  # also the order of the checks
HeaderFields = tuple  # ((config field, kind), ...) from header slot 2 on


# ------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the --model value and the file-name prefix: "gpt2"
    title: str  # for people: "GPT-2"
    config: type  # the config dataclass (the llm.c header's fields)
    # llm.c files
    checkpoint_magic: int
    header_fields: HeaderFields  # the checkpoint header's config fields (HEADER_KINDS)
    tensor_layout: Callable[[object], Layout]  # file order of the checkpoint's tensors
    token_magic: int
    token_version: int
    token_dtype: str  # little-endian numpy dtype of one token
    token_max_id: int
    tied_parameters: tuple[tuple[str, str], ...] = ()  # (kept name, alias on another stage)
    # the name -> place rule (compare.locate); layers are ``h.{i}.``
    layer_pattern: str = r"^h\.(\d+)\."
    embedding: tuple[str, ...] = ("wte.",)
    final_norm: tuple[str, ...] = ("ln_f.",)
    head: tuple[str, ...] = ("lm_head.",)
    # synthetic assets (harness.assets): the seed stream of its weights, its size per preset
    asset_stream: int = 0
    asset_configs: Mapping[str, object] = field(default_factory=dict)

    def tied_aliases(self) -> tuple[str, ...]:
        """Names that stand for another parameter (reported under that one's name)."""
        return tuple(alias for _kept, alias in self.tied_parameters)

    def place(self, name: str) -> int | str:
        """A parameter's place: its global transformer layer, or "embedding", "final_norm",
        "head", "other"."""
        match = re.match(self.layer_pattern, name)
        if match:
            return int(match.group(1))
        for part, prefixes in (("embedding", self.embedding), ("final_norm", self.final_norm),
                               ("head", self.head)):
            if name.startswith(prefixes):
                return part
        return "other"


# ------------------------------------------------------------------------------- the registry

MODEL_SPECS: dict[str, ModelSpec] = {}


class UnknownModelError(ValueError):
    """A model name or config type that no registered ModelSpec has."""


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add ``spec`` to MODEL_SPECS; a second, different spec under a known name is refused."""
    known = MODEL_SPECS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"model {spec.name!r} is already registered (as {known.title})")
    for other in MODEL_SPECS.values():
        if other.name != spec.name and other.config is spec.config:
            raise ValueError(f"model {spec.name!r}: config {spec.config.__name__} is already "
                             f"model {other.name!r}'s")
    MODEL_SPECS[spec.name] = spec
    return spec


def _known() -> str:
    return ", ".join(MODEL_SPECS) or "none"


def get_model_spec(name: str) -> ModelSpec:
    try:
        return MODEL_SPECS[name]
    except (KeyError, TypeError):
        raise UnknownModelError(f"unknown model {name!r}; known models: {_known()}") from None


def spec_for_config(config) -> ModelSpec:
    """The spec whose config type ``config`` is."""
    for spec in MODEL_SPECS.values():
        if type(config) is spec.config:
            return spec
    types = ", ".join(s.config.__name__ for s in MODEL_SPECS.values())
    raise UnknownModelError(f"no registered model has config type {type(config).__name__}; "
                            f"known: {types} (models: {_known()})")


def model_names() -> tuple[str, ...]:
    return tuple(MODEL_SPECS)


def layer_of(name: str, model: str | None = None) -> int | str:
    """A parameter's place by ``model``'s rule, or by the first registered rule that places
    it when the model is not given (the families share llm.c's naming)."""
    if model is not None and model in MODEL_SPECS:
        return MODEL_SPECS[model].place(name)
    for spec in MODEL_SPECS.values():
        part = spec.place(name)
        if part != "other":
            return part
    return "other"


# ------------------------------------------------------------------------------- the families

_LLMC_VERSIONS = {3: "float32", 5: "bfloat16"}  # llm.c: the same for every family


def _llama3_sizes(n_layer, n_embd, n_head, n_kv_head, block_size, vocab_size, multiple_of):
    return LLaMA3Config(
        block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
        n_kv_head=n_kv_head, n_embd=n_embd, ffn_dim_multiplier=1.0, multiple_of=multiple_of,
        norm_eps=1e-5, rope_theta=10000.0, use_scaled_rope=True,
    )


GPT2_SPEC = register_model(ModelSpec(
    name="gpt2",
    title="GPT-2",
    config=GPT2Config,
    checkpoint_magic=20240326,
    header_fields=tuple((name, "positive") for name in (
        "block_size", "vocab_size", "n_layer", "n_head", "n_embd", "padded_vocab_size")),
    tensor_layout=_gpt2_tensor_layout,
    token_magic=20240520, token_version=1, token_dtype="<u2", token_max_id=2**16 - 1,
    tied_parameters=(("wte.weight", "lm_head.weight"),),
    embedding=("wte.", "wpe."),
    asset_stream=1,
    asset_configs={
        # 8 layers so pipeline layouts such as 4,4 / 2,6 / 4 stages / vpp 2 have room; the
        # vocabulary is padded 256 -> 320 so the padded rows are exercised.
        "tiny": GPT2Config(block_size=64, vocab_size=256, n_layer=8, n_head=4, n_embd=32,
                           padded_vocab_size=320),
        "small": GPT2Config(block_size=256, vocab_size=1000, n_layer=12, n_head=8, n_embd=128,
                            padded_vocab_size=1024),
        # pads 8000 -> 8064 like llm.c (multiple of 128)
        "bench": GPT2Config(block_size=256, vocab_size=8000, n_layer=8, n_head=8, n_embd=256,
                            padded_vocab_size=8064),
        # What InfiniTrain master's GPT-2 loader accepts: it never reads n_kv_head, which stays
        # 12, and config.h checks n_kv_head == n_head, so only 12 heads load. Padded 256 -> 320
        # (a multiple of TP 4 and 8) so a TP dump's last vocabulary shard holds padding rows.
        "infinitrain": GPT2Config(block_size=64, vocab_size=256, n_layer=8, n_head=12,
                                  n_embd=48, padded_vocab_size=320),
    },
))

LLAMA3_SPEC = register_model(ModelSpec(
    name="llama3",
    title="LLaMA 3",
    config=LLaMA3Config,
    checkpoint_magic=20240803,
    # InfiniTrain's reader layout (llm.c's train_llama3.py truncates the float fields)
    header_fields=(
        ("block_size", "positive"), ("vocab_size", "positive"), ("n_layer", "positive"),
        ("n_head", "positive"), ("n_kv_head", "positive"), ("n_embd", "positive"),
        ("ffn_dim_multiplier", "float32"), ("multiple_of", "positive"),
        ("norm_eps", "float32"), ("rope_theta", "float32"), ("use_scaled_rope", "bool"),
        ("max_gen_batch_size", "count"), ("version_major", "int"), ("version_minor", "int"),
    ),
    tensor_layout=_llama3_tensor_layout,
    # InfiniTrain loads them as int32: the same bytes while ids stay below 2**31
    token_magic=20240801, token_version=7, token_dtype="<u4", token_max_id=2**31 - 1,
    asset_stream=2,
    asset_configs={
        "tiny": _llama3_sizes(8, 32, 4, 2, 64, 256, multiple_of=32),  # ffn 96
        "small": _llama3_sizes(12, 128, 8, 4, 256, 1024, multiple_of=64),  # ffn 384
        "bench": _llama3_sizes(8, 256, 8, 4, 256, 8192, multiple_of=256),  # ffn 768
        # What InfiniTrain master's LLaMA 3 loader accepts: it never sets original_vocab_size,
        # which stays 128256, and config.h checks vocab_size >= it. 4 heads and 4 KV heads:
        # TP 2 and 4 (the most InfiniTrain's config uses) divide them as InfiniTrain requires. Width 32 keeps the 128256-row head cheap.
        "infinitrain": _llama3_sizes(8, 32, 4, 4, 64, 128256, multiple_of=32),  # ffn 96
    },
))

CHECKPOINT_VERSIONS = _LLMC_VERSIONS
