"""The model families' torch-free contract: one ``ModelSpec`` per family, and nothing that imports torch.

A spec is what the harness side (cases, assets, the llm.c readers, the comparison) and the
trainer both need to know about a family, as data:

- its config dataclass (the llm.c header's hyper-parameters; defined here, torch-free);
- its llm.c file formats: checkpoint magic, versions, header fields and tensor order (stacked
  over layers, llm.c's, or layer by layer, tiny Mixtral's), token-file magic / version / dtype;
- its tied parameters (GPT-2: ``wte.weight`` is also the head, ``lm_head.weight`` on a part
  without the embedding), and the name -> global layer rule the comparison's locator uses;
- the sizes of its synthetic assets per preset.

The torch side of a family (its module, names = checkpoint keys, and its parallelize plan,
written as code) is ``harness/trainer/models/<family>/``, registered there as a ``TrainSpec``
that holds this spec (docs/design.md, "Adding a model family").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

# ------------------------------------------------------------------------------- configs


def _require_positive(owner: str, **fields: int) -> None:
    for name, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} is {value!r}; expected a positive integer")


def _require_positive_finite(owner: str, **fields: float) -> None:
    for name, value in fields.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{owner}.{name} is {value!r}; expected a positive, finite number")


def is_norm_gain(name: str) -> bool:
    """A norm's gain by its llm.c name: the blocks' ln_1 / ln_2, ln_f, qwen3's attn.q_norm /
    attn.k_norm (weights and synthetic assets initialize them near 1, not near 0)."""
    return name.endswith(".weight") and (".ln_" in f".{name}" or name.endswith("_norm.weight"))


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


@dataclass(frozen=True)
class Qwen3Config:
    """Qwen3 as InfiniTrain's ``qwen3`` program computes it (feat/add_Qwen3-8B@a3f84f8; the
    lines below are that branch's): LLaMA 3's blocks with an RMSNorm over each q and k head
    before RoPE (``use_qk_norm``, eps norm_eps: example/qwen3/checkpoint_loader.cc:87-88),
    an untied head (config.h:22), and the MLP width fixed at 3 * n_embd (the loader's
    ``n_embd * 4.5 * 2 / 3``, checkpoint_loader.cc:151; the model's ``int(2 * int(n_embd *
    4.5)) / 3``, transformer/mlp.cc:24-28, agrees for an even n_embd). Fields in the header's
    order (checkpoint_loader.cc:52-70); slot 8, ffn_dim_multiplier, holds 0.0 (QWEN3_SPEC)."""

    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    multiple_of: int = 1  # convert_hf_qwen3_to_llmc.py:159 writes 1; mlp.cc:37-39 rounds up to it
    norm_eps: float = 1e-6  # config.h:26; the q/k norms' eps too (checkpoint_loader.cc:88)
    rope_theta: float = 1000000.0  # config.h:24
    use_scaled_rope: bool = False  # PrecomputeFreqsCis ignores it (transformer/utils.cc:15-18)
    max_gen_batch_size: int = 4
    version_major: int = 1  # convert_hf_qwen3_to_llmc.py:94-95
    version_minor: int = 0

    def __post_init__(self) -> None:
        _require_positive(
            "Qwen3Config", block_size=self.block_size, vocab_size=self.vocab_size,
            n_layer=self.n_layer, n_head=self.n_head, n_kv_head=self.n_kv_head,
            n_embd=self.n_embd, multiple_of=self.multiple_of)
        if self.n_embd % self.n_head:  # causal_self_attention.cc:63
            raise ValueError(
                f"Qwen3Config.n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:  # causal_self_attention.cc:73
            raise ValueError(f"Qwen3Config.n_head={self.n_head} is not divisible by "
                             f"n_kv_head={self.n_kv_head}")
        if self.head_dim % 2:  # RoPE rotates (even, odd) pairs: causal_self_attention.cc:142-150
            raise ValueError(f"Qwen3Config.n_embd / n_head = {self.head_dim} is odd; RoPE "
                             f"needs an even head dimension")
        if self.ffn_dim % self.multiple_of:  # the model would round what the loader reads
            raise ValueError(f"Qwen3Config.multiple_of={self.multiple_of} does not divide the "
                             f"MLP width 3 * n_embd = {self.ffn_dim}; expected a divisor "
                             f"(InfiniTrain's model rounds up to it, its loader does not)")
        _require_positive_finite("Qwen3Config", norm_eps=self.norm_eps, rope_theta=self.rope_theta)
        if self.use_scaled_rope is not False:
            raise ValueError(f"Qwen3Config.use_scaled_rope is {self.use_scaled_rope!r}; the "
                             f"qwen3 program leaves the scaling out (transformer/utils.cc:15-18),"
                             f" so only False computes what it computes")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """The SwiGLU width: 3 * n_embd, as the qwen3 loader reads it."""
        return 3 * self.n_embd


@dataclass(frozen=True)
class MixtralConfig:
    """tiny Mixtral (InfiniTrain feat/support_moe's ``tiny_mixtral``): LLaMA-style attention, a
    top-k Mixture-of-Experts feed-forward. Fields in the checkpoint header's order; the defaults
    are ``TinyMixtralConfig()`` (feat/support_moe@b7e0760:example/tiny_mixtral/config.h:11-41,
    the lines below are that file's), the one shape the binary loads: its loader CHECK_EQs every
    header field against them (checkpoint_loader.cc:74-97). The checks are
    SanitizeTinyMixtralConfig's (config.h:43-74). The mathematics:
    harness.contracts.mixtral_facts."""

    block_size: int = 32768  # config.h:13
    vocab_size: int = 128256  # config.h:14 (original_vocab_size the same: checkpoint_loader.cc:51)
    n_layer: int = 32  # config.h:16
    n_head: int = 4  # config.h:17
    n_kv_head: int = 1  # config.h:18
    n_embd: int = 512  # config.h:19
    num_experts: int = 8  # config.h:33
    # Read and compared (checkpoint_loader.cc:56, :85) but sizing nothing: an MoE expert's width
    # is moe_ffn_hidden_size (mlp.cc:41-46).
    ffn_expansion_ratio: float = 3.5  # config.h:27
    norm_eps: float = 1e-5  # config.h:28
    rope_theta: float = 1000000.0  # config.h:29
    use_scaled_rope: bool = False  # config.h:30
    router_topk: int = 2  # config.h:35
    moe_ffn_hidden_size: int = 1792  # config.h:36

    def __post_init__(self) -> None:
        _require_positive(
            "MixtralConfig",
            block_size=self.block_size, vocab_size=self.vocab_size, n_layer=self.n_layer,
            n_head=self.n_head, n_kv_head=self.n_kv_head, n_embd=self.n_embd,
            num_experts=self.num_experts, router_topk=self.router_topk,
            moe_ffn_hidden_size=self.moe_ffn_hidden_size,
        )
        if self.n_embd % self.n_head:  # config.h:53
            raise ValueError(
                f"MixtralConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:  # config.h:50-51
            raise ValueError(f"MixtralConfig.n_head={self.n_head} is not divisible by "
                             f"n_kv_head={self.n_kv_head}")
        if self.head_dim % 2:  # RoPE rotates (even, odd) pairs: causal_self_attention.cc:142-150
            raise ValueError(f"MixtralConfig.n_embd / n_head = {self.head_dim} is odd; RoPE "
                             f"needs an even head dimension")
        if self.router_topk > self.num_experts:  # config.h:68
            raise ValueError(f"MixtralConfig.router_topk={self.router_topk} exceeds "
                             f"num_experts={self.num_experts}")
        _require_positive_finite("MixtralConfig", ffn_expansion_ratio=self.ffn_expansion_ratio,
                                 norm_eps=self.norm_eps, rope_theta=self.rope_theta)
        if self.use_scaled_rope is not False:
            # config.h:61 refuses it, and PrecomputeFreqsCis ignores the flag (utils.cc:15-18)
            raise ValueError(f"MixtralConfig.use_scaled_rope is {self.use_scaled_rope!r}; "
                             f"tiny Mixtral keeps scaled RoPE disabled (expected False)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """An expert's hidden width (what tensor parallelism splits): moe_ffn_hidden_size."""
        return self.moe_ffn_hidden_size


# ------------------------------------------------------------------------------- llm.c layouts

# [(name, per-layer shape, per layer?), ...] in file order. A per-layer entry is one tensor per
# layer, h.{i}.name: llm.c's families store each stacked over all layers (every layer's ln_1,
# then every layer's c_attn, ...); a ``layer_major`` family stores layer 0's per-layer tensors,
# then layer 1's, ... (its per-layer entries are one run in the list, between the first and
# the last tensors). In a stacked layout, consecutive per-layer entries that carry the same
# group label (a string in place of True) are stored layer by layer as one group: layer 0's
# group, then layer 1's, ... (qwen3's q and k norms).
Layout = list


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


def _qwen3_tensor_layout(config: Qwen3Config) -> Layout:
    """LoadFromLLMC's read order (feat/add_Qwen3-8B@a3f84f8:example/qwen3/checkpoint_loader.cc:
    186-436): LLaMA 3's, each tensor stacked over the layers, with the q and k norms after the
    ln_1s, read layer by layer as pairs (layer 0's q_norm, k_norm, layer 1's, ...: :225-286).
    InfiniTrain's own converter (scripts/convert_hf_qwen3_to_llmc.py:177-244) writes every
    tensor layer by layer instead: the two agree for one layer only, and the loader is what the
    program runs, so the harness writes the loader's order."""
    C, hd = config.n_embd, config.head_dim
    qkv = C + 2 * config.n_kv_head * hd
    ffn = config.ffn_dim
    return [
        ("wte.weight", (config.vocab_size, C), False),
        ("ln_1.weight", (C,), True),
        ("attn.q_norm.weight", (hd,), "qk_norm"),
        ("attn.k_norm.weight", (hd,), "qk_norm"),
        ("attn.c_attn.weight", (qkv, C), True),
        ("attn.c_proj.weight", (C, C), True),
        ("ln_2.weight", (C,), True),
        ("mlp.c_fc.weight", (ffn, C), True),
        ("mlp.c_fc2.weight", (ffn, C), True),  # the SwiGLU gate (transformer/mlp.cc:86-88)
        ("mlp.c_proj.weight", (C, ffn), True),
        ("ln_f.weight", (C,), False),
        ("lm_head.weight", (config.vocab_size, C), False),
    ]


def _mixtral_tensor_layout(config: MixtralConfig) -> Layout:
    """LoadFromLLMC's read order (feat/support_moe@b7e0760:example/tiny_mixtral/
    checkpoint_loader.cc:139-161), layer by layer; InfiniTrain's ``transformer.`` prefix dropped
    as for the other families. c_attn's rows are q, k, v one after the other (:143-149)."""
    C, F = config.n_embd, config.moe_ffn_hidden_size
    qkv = C + 2 * config.n_kv_head * config.head_dim
    per_layer = [
        ("ln_1.weight", (C,)),
        ("attn.c_attn.weight", (qkv, C)),
        ("attn.c_proj.weight", (C, C)),
        ("ln_2.weight", (C,)),
        ("mlp.router.weight", (config.num_experts, C)),
    ]
    for e in range(config.num_experts):
        per_layer += [
            (f"mlp.experts.expert_{e}.c_fc2.weight", (F, C)),  # Mixtral's w1, the gate
            (f"mlp.experts.expert_{e}.c_fc.weight", (F, C)),  # w3, up
            (f"mlp.experts.expert_{e}.c_proj.weight", (C, F)),  # w2, down
        ]
    head = [("wte.weight", (config.vocab_size, C), False)]
    tail = [("ln_f.weight", (C,), False), ("lm_head.weight", (config.vocab_size, C), False)]
    return head + [(name, shape, True) for name, shape in per_layer] + tail


def _mixtral_parameter_count(config: MixtralConfig) -> int:
    """The float count of _mixtral_tensor_layout in closed form: a damaged header may claim
    2**31 - 1 experts, and the count that refuses the file by its length must stay instant
    (listing that many tensors would not)."""
    C, F, E = config.n_embd, config.moe_ffn_hidden_size, config.num_experts
    qkv = C + 2 * config.n_kv_head * config.head_dim
    per_layer = C + qkv * C + C * C + C + E * C + E * 3 * F * C
    return 2 * config.vocab_size * C + config.n_layer * per_layer + C


# The llm.c checkpoint header after (magic, version): one int32 slot per config field, in order.
# How a slot is stored and checked when read:
#   "positive"  an int32 > 0;          "count"  an int32 >= 0;     "int"  an int32 as stored;
#   "float32"   float32 bits (positive, finite, normal);            "bool" 0 or 1;
#   "unused"    a slot the family's loader skips: written 0, not read (its name is a label,
#               not a config field);
#   "zero"      a slot the family's loader reads but that only 0 keeps the program working:
#               written 0, any other value refused (its name is a label, not a config field).
HEADER_KINDS = ("positive", "float32", "bool", "count", "int", "unused", "zero")  # check order
HeaderFields = tuple  # ((config field, kind), ...) from header slot 2 on

_LLMC_VERSIONS = ((3, "float32"), (5, "bfloat16"))  # llm.c's: the same for GPT-2 and LLaMA 3


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
    # (version, stored dtype) of the checkpoints the family's loader reads
    checkpoint_versions: tuple[tuple[int, str], ...] = _LLMC_VERSIONS
    # the per-layer tensors stored layer by layer rather than each stacked over layers (Layout)
    layer_major: bool = False
    # the checkpoint's float count in closed form, for a layout whose length grows with a header
    # field other than n_layer (None: summed from tensor_layout)
    parameter_count: Callable[[object], int] | None = None
    # the name -> place rule (compare.locate); layers are ``h.{i}.``
    layer_pattern: str = r"^h\.(\d+)\."
    embedding: tuple[str, ...] = ("wte.",)
    final_norm: tuple[str, ...] = ("ln_f.",)
    head: tuple[str, ...] = ("lm_head.",)
    # synthetic assets (harness.assets): the seed stream of its weights, its size per preset
    asset_stream: int = 0
    asset_configs: Mapping[str, object] = field(default_factory=dict)
    # whether a harness config that names no models runs this family's cases (harness.cases)
    in_default_cases: bool = True

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


def _qwen3_sizes(n_layer, n_embd, n_head, n_kv_head, block_size, vocab_size):
    return Qwen3Config(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer,
                       n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd)
    # multiple_of 1, norm_eps 1e-6, rope_theta 1e6, no scaled RoPE: the converter's values


QWEN3_SPEC = register_model(ModelSpec(
    name="qwen3",
    title="Qwen3",
    config=Qwen3Config,
    # feat/add_Qwen3-8B@a3f84f8:example/qwen3/checkpoint_loader.cc:37-38 (the lines below are
    # that file's, unless named): LLaMA 3's header with its own magic, version 3 only
    checkpoint_magic=20240804,
    # LLaMA 3's header fields, but slot 8, ffn_dim_multiplier, is read at :63 and, when > 0,
    # given to the model (:79-80), whose MLP it would widen while the loader reads 3 * n_embd
    # (:151): only 0.0 works, which the converter writes (convert_hf_qwen3_to_llmc.py:78-82)
    header_fields=tuple((name, "zero" if name == "ffn_dim_multiplier" else kind)
                        for name, kind in LLAMA3_SPEC.header_fields),
    tensor_layout=_qwen3_tensor_layout,
    # LLaMA 3's token files (example/common/tiny_shakespeare_dataset.cc:27-30: the dataset
    # knows GPT-2's and LLaMA 3's magic only; Qwen3's 151936-token vocabulary needs 32 bits)
    token_magic=LLAMA3_SPEC.token_magic, token_version=LLAMA3_SPEC.token_version,
    token_dtype=LLAMA3_SPEC.token_dtype, token_max_id=LLAMA3_SPEC.token_max_id,
    checkpoint_versions=((3, "float32"),),  # CHECK_EQ(version, kQwen3FP32Version) (:55)
    # run where a config names it: the default cases stay GPT-2's and LLaMA 3's
    in_default_cases=False,
    asset_stream=6,
    asset_configs={
        # 8 layers as the other families' tiny presets; GQA 4:2 so TP 2 divides the kv heads
        "tiny": _qwen3_sizes(8, 32, 4, 2, 64, 256),  # ffn 96, head_dim 8
        "small": _qwen3_sizes(12, 128, 8, 4, 256, 1024),  # ffn 384
        "bench": _qwen3_sizes(8, 256, 8, 4, 256, 8192),  # ffn 768
        # What the qwen3 program loads: no vocabulary check (the loader never compares it
        # with original_vocab_size), GQA 8:4 so TP 2 and 4 divide both head counts (:109-112)
        "infinitrain": _qwen3_sizes(8, 64, 8, 4, 64, 256),  # ffn 192, head_dim 8
    },
))


def _mixtral_sizes(n_layer, n_embd, n_head, n_kv_head, block_size, vocab_size, num_experts,
                   moe_ffn_hidden_size, router_topk=2):
    return MixtralConfig(
        block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
        n_kv_head=n_kv_head, n_embd=n_embd, num_experts=num_experts,
        moe_ffn_hidden_size=moe_ffn_hidden_size, router_topk=router_topk,
    )  # ffn_expansion_ratio, norm_eps, rope_theta (1e6), use_scaled_rope: TinyMixtralConfig()'s


MIXTRAL_SPEC = register_model(ModelSpec(
    name="mixtral",
    title="tiny Mixtral",
    config=MixtralConfig,
    # feat/support_moe@b7e0760:example/tiny_mixtral/checkpoint_loader.cc:22 (the lines below
    # are that file's, unless named)
    checkpoint_magic=20260513,
    # ConfigFromLLMC's slots 2-16 (checkpoint_loader.cc:49-66); 10 and 11 are skipped (:57)
    header_fields=(
        ("block_size", "positive"), ("vocab_size", "positive"), ("n_layer", "positive"),
        ("n_head", "positive"), ("n_kv_head", "positive"), ("n_embd", "positive"),
        ("num_experts", "positive"), ("ffn_expansion_ratio", "float32"),
        ("slot 10 (unused)", "unused"), ("slot 11 (unused)", "unused"),
        ("norm_eps", "float32"), ("rope_theta", "float32"), ("use_scaled_rope", "bool"),
        ("router_topk", "positive"), ("moe_ffn_hidden_size", "positive"),
    ),
    tensor_layout=_mixtral_tensor_layout,
    # LLaMA 3's token files: the program reads them with the same dataset class
    # (tiny_shakespeare_dataset.cc:27-30) and the config points it at LLaMA 3's file
    token_magic=LLAMA3_SPEC.token_magic, token_version=LLAMA3_SPEC.token_version,
    token_dtype=LLAMA3_SPEC.token_dtype, token_max_id=LLAMA3_SPEC.token_max_id,
    # version 2, float32 only (checkpoint_loader.cc:23, :116-117)
    checkpoint_versions=((2, "float32"),),
    layer_major=True,
    parameter_count=_mixtral_parameter_count,
    # run where a config names it: the default cases (and their layouts) stay GPT-2's and
    # LLaMA 3's, and InfiniTrain's tiny_mixtral is one device only
    in_default_cases=False,
    asset_stream=5,
    asset_configs={
        # 8 layers, as the other families' tiny presets, so the same pipeline layouts fit;
        # GQA 4:2 so TP 2 divides the kv heads; 4 experts, top 2
        "tiny": _mixtral_sizes(8, 32, 4, 2, 64, 256, num_experts=4, moe_ffn_hidden_size=64),
        "small": _mixtral_sizes(12, 128, 8, 2, 256, 1024, num_experts=8,
                                moe_ffn_hidden_size=448),  # 3.5 * 128, as config.h's ratio
        "bench": _mixtral_sizes(8, 256, 8, 2, 256, 8192, num_experts=8,
                                moe_ffn_hidden_size=896),
        # InfiniTrain's tiny_mixtral loads config.h's shape only (the 857M-parameter model:
        # checkpoint_loader.cc:74-97 compares every header field with it), which no preset
        # generates; this one keeps every choice of config.h that is not a size: GQA 4:1,
        # 8 experts top 2, the 128256-token vocabulary, expert width 3.5 * n_embd.
        "infinitrain": _mixtral_sizes(8, 32, 4, 1, 64, 128256, num_experts=8,
                                      moe_ffn_hidden_size=112),
    },
))

# llm.c's (version, dtype) pairs, as a dict: GPT-2's and LLaMA 3's (a family's own:
# ModelSpec.checkpoint_versions)
CHECKPOINT_VERSIONS = dict(_LLMC_VERSIONS)
