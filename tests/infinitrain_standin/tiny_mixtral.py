"""The stand-in ``tiny_mixtral``: ``python -m tests.infinitrain_standin.tiny_mixtral FLAGS...`` (what a
support_moe build folder's ``tiny_mixtral`` script execs). It plays InfiniTrain feat/support_moe
(b7e0760) ``example/tiny_mixtral/main.cc``, and with ``@program:mixtral`` its later rename
(later@0d2bfc7 ``example/mixtral/main.cc``: the same flags and checks, glog's program name
``mixtral``, and the step line ending ``| peak used: {:5d} MB | peak reserved: {:5d} MB)``,
later@ed83c8b:example/mixtral/main.cc:155-159):

- gflags-strict with exactly that program's flags (feat/support_moe:example/tiny_mixtral/main.cc:24-35):
  no ``nthread_per_process`` / ``tensor_parallel`` / ..., so those are ``ERROR: unknown command line
  flag`` (exit 1). Single device only: the binary calls InitAllEnv(1, 1, false, 1, 1)
  (feat/support_moe:example/tiny_mixtral/main.cc:61-66) and never builds a process group.
- its checks, in its order and words: the loader's open / header / magic / version CHECKs
  (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:42-46), SanitizeTinyMixtralConfig on
  the header's config (feat/support_moe:example/tiny_mixtral/config.h:43-74), the header-vs-runtime
  comparisons (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:34, :77-96), the weights'
  reads and the trailing-bytes CHECK (checkpoint_loader.cc:119, :135, :163), then
  ValidateRuntimeFlags (feat/support_moe:example/tiny_mixtral/main.cc:46-52), the device
  (feat/support_moe:example/tiny_mixtral/main.cc:78-85) and dtype (:92-99) handling.
- the step line on STDOUT via std::cout, nothing of the steps on stderr
  (feat/support_moe:example/tiny_mixtral/main.cc:140-144), then ``final N iters avg: X.XXXms``
  (feat/support_moe:example/tiny_mixtral/main.cc:147-155).
- gradient accumulation = global_batch_size / micro_batch_size
  (feat/support_moe:example/tiny_mixtral/main.cc:108), the loss each micro step divided by it
  (:128-129), Adam (feat/support_moe:example/tiny_mixtral/main.cc:102-103, defaults beta1 0.9,
  beta2 0.999, eps 1e-8 at feat/support_moe:infini_train/include/optimizer.h:49-50; the update of
  feat/support_moe:infini_train/src/kernels/cpu/accumulate_grad.cc:22-33). The data loader wraps
  to its beginning when exhausted (feat/support_moe:example/tiny_mixtral/main.cc:118-120).

What it trains is the real tiny Mixtral: the checkpoint's float32 weights, read in the loader's
order (checkpoint_loader.cc:139-161: wte; per layer ln_1, the q / k / v rows of the packed
c_attn, c_proj, ln_2, the router, per expert c_fc2 / c_fc / c_proj; ln_f; lm_head), through
mixtral_math.py (RMSNorm, interleaved RoPE with rope_theta, GQA attention, the top-k-then-softmax
router of moe_utils.cc, SwiGLU experts, untied head, mean cross-entropy; written from InfiniTrain's
source, torch autograd for the backward), deterministic: two runs of the same flags and files
print the same losses bit for bit. bfloat16 is torch.autocast over the float32 weights.

The compiled-in config. The real binary CHECKs every header field against TinyMixtralConfig()
(config.h:11-41: 32 layers, width 512, 128256 tokens: a 3.4 GB file), and so does the stand-in by
default. ``STANDIN_MIXTRAL_CONFIG=file`` (or ``build.make_build_dir(..., mixtral_config="file")``,
which bakes it into the folder's script) emulates a binary compiled with a config.h equal to the
checkpoint's own header, so a small file loads: its header is still read, sanitized and compared
(with itself), its weights read and checked for size, and ValidateRuntimeFlags' block_size is the
file's.

``write_checkpoint(path, weights=..., **config)`` writes a file in the loader's format:
header only by default (the header tests; the loader would then fail at
``Failed to read tensor transformer.wte.weight``), or with weights (``weights=True``: seeded
``init_weights``; or a dict of InfiniTrain's names). ``SMALL_CONFIG`` is a config small enough
for CPU tests.

Differences from the real binary: a run without --llmc_filepath (InfiniTrain initialises a fresh
config.h model, main.cc:73-75) is refused by the stand-in after the flag checks (exit 2: it trains
only models read from a file); a token id outside the vocabulary is refused (exit 2) where
InfiniTrain would read out of bounds.

Planted: ``STANDIN_PLANT_ROUTER=other_order``: the router takes the softmax over every expert
first and then the top k (moe_utils.cc:27-31, the router_pre_softmax branch, not renormalised)
instead of the source's top k of the logits then the softmax (the self-check cannot see it: every
run shares it; the baseline's losses can).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from . import gflags
from .gflags import Flag
from .glog import Logger

_F = "example/tiny_mixtral/main.cc"
LOADER = "checkpoint_loader.cc"

MAGIC = 20260513  # feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:22
VERSION = 2  # feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:23
HEADER_INTS = 256  # feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:24

# TinyMixtralConfig(), feat/support_moe:example/tiny_mixtral/config.h:11-41
RUNTIME_CONFIG = {
    "block_size": 32768, "vocab_size": 128256, "original_vocab_size": 128256, "n_layer": 32,
    "n_head": 4, "n_kv_head": 1, "n_embd": 512, "ffn_expansion_ratio": 3.5, "norm_eps": 1e-5,
    "rope_theta": 1000000.0, "use_scaled_rope": False, "num_experts": 8, "router_topk": 2,
    "moe_ffn_hidden_size": 1792,
}
# A config small enough for CPU tests (loads with STANDIN_MIXTRAL_CONFIG=file): the 4:1 GQA
# ratio and top-2 routing of config.h, 4 experts, a 256-token vocabulary (the synthetic token
# files' ids are bytes).
SMALL_CONFIG = dict(RUNTIME_CONFIG, block_size=64, vocab_size=256, original_vocab_size=256, n_layer=2,
                    n_head=4, n_kv_head=1, n_embd=32, num_experts=4, router_topk=2,
                    moe_ffn_hidden_size=48)
CONFIG_MODES = ("", "file")  # STANDIN_MIXTRAL_CONFIG: config.h's values, or the file's header
ROUTER_PLANTS = ("other_order",)  # STANDIN_PLANT_ROUTER


def flag_set() -> dict[str, Flag]:
    """feat/support_moe:example/tiny_mixtral/main.cc:24-35 (no validators), plus gflags' own."""
    rows = [
        ("input_bin", "string", "", "input .bin to train on"),  # main.cc:24
        ("micro_batch_size", "uint32", 4, "micro batch size per training step"),  # main.cc:25
        ("global_batch_size", "uint32", 4,
         "global batch size across gradient accumulation and data parallelism"),  # main.cc:26
        ("sequence_length", "uint32", 64, "sequence length"),  # main.cc:27
        ("num_iteration", "uint32", 10, "number of training iterations"),  # main.cc:28
        ("learning_rate", "double", 1e-4, "Adam learning rate"),  # main.cc:29
        ("llmc_filepath", "string", "",
         "optional PyTorch-generated tiny Mixtral LLMC model file path to load before training"),  # main.cc:30-31
        ("device", "string", "cpu", "Training device: cpu or cuda."),  # main.cc:32
        ("dtype", "string", "float32", "precision used in training (float32/bfloat16)"),  # main.cc:33
        ("log_interval", "uint32", 1, "Print train loss every N steps. 0 disables step loss logging."),  # main.cc:34
        ("print_timing", "bool", False, "Print training-loop elapsed time and token throughput."),  # main.cc:35
    ]
    return gflags.with_gflags_flags({n: Flag(n, k, d, None, m, _F) for n, k, d, m in rows})


def header_ints(**overrides) -> np.ndarray:
    """The 256-slot header of a tiny Mixtral LLMC file, as ConfigFromLLMC reads it
    (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:45-66): int32 slots 0-8, 14-16,
    float32 slots 9, 12, 13. ``overrides`` replace the magic / version / config values."""
    c = dict(RUNTIME_CONFIG, magic=MAGIC, version=VERSION)
    c.update(overrides)
    h = np.zeros(HEADER_INTS, np.int32)
    hf = h.view(np.float32)
    for slot, key in ((0, "magic"), (1, "version"), (2, "block_size"), (3, "vocab_size"), (4, "n_layer"),
                      (5, "n_head"), (6, "n_kv_head"), (7, "n_embd"), (8, "num_experts"),
                      (14, "use_scaled_rope"), (15, "router_topk"), (16, "moe_ffn_hidden_size")):
        h[slot] = int(c[key])
    for slot, key in ((9, "ffn_expansion_ratio"), (12, "norm_eps"), (13, "rope_theta")):
        hf[slot] = np.float32(c[key])
    return h


def tensor_layout(c: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """The weights in file order (checkpoint_loader.cc:139-161): (InfiniTrain state-dict name,
    shape, the name a failed read reports). The packed c_attn is read as its q, k, v rows
    (:143-149), each its own entry under ``<c_attn>.q_proj`` / ``.k_proj`` / ``.v_proj``."""
    C, V, E, FF = c["n_embd"], c["vocab_size"], c["num_experts"], c["moe_ffn_hidden_size"]
    D = C // c["n_head"]
    q_rows, kv_rows = c["n_head"] * D, c["n_kv_head"] * D
    out = [("transformer.wte.weight", (V, C), "transformer.wte.weight")]
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}"
        attn = f"{p}.attn.c_attn.weight"
        out += [(f"{p}.ln_1.weight", (C,), f"{p}.ln_1.weight"),
                (attn, (q_rows, C), f"{attn}.q_proj"), (attn, (kv_rows, C), f"{attn}.k_proj"),
                (attn, (kv_rows, C), f"{attn}.v_proj"),
                (f"{p}.attn.c_proj.weight", (C, C), f"{p}.attn.c_proj.weight"),
                (f"{p}.ln_2.weight", (C,), f"{p}.ln_2.weight"),
                (f"{p}.mlp.router.weight", (E, C), f"{p}.mlp.router.weight")]
        for e in range(E):
            q = f"{p}.mlp.experts.expert_{e}"
            out += [(f"{q}.c_fc2.weight", (FF, C), f"{q}.c_fc2.weight"),
                    (f"{q}.c_fc.weight", (FF, C), f"{q}.c_fc.weight"),
                    (f"{q}.c_proj.weight", (C, FF), f"{q}.c_proj.weight")]
    out += [("transformer.ln_f.weight", (C,), "transformer.ln_f.weight"),
            ("lm_head.weight", (V, C), "lm_head.weight")]
    return out


def shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Each parameter's shape (the packed c_attn whole)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape, _ in tensor_layout(c):
        if name in out:  # the k / v rows of a packed c_attn
            out[name] = (out[name][0] + shape[0], shape[1])
        else:
            out[name] = shape
    return out


def init_weights(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 weights: norms 1 + N(0, 0.02), the router N(0, 1) / sqrt(n_embd) (so tokens
    pick their experts decidedly), the rest N(0, 0.02), the residual projections (c_proj)
    scaled by 1 / sqrt(2 n_layer)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes(c).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[name] = 1 + np.float32(0.02) * noise
        elif name.endswith("router.weight"):
            out[name] = noise / np.float32(np.sqrt(c["n_embd"]))
        elif name.endswith("c_proj.weight"):
            out[name] = np.float32(0.02 / np.sqrt(2 * c["n_layer"])) * noise
        else:
            out[name] = np.float32(0.02) * noise
    return out


def write_checkpoint(path, weights: bool | dict = False, seed: int = 0, **overrides) -> str:
    """Write a tiny Mixtral LLMC file: the header (magic 20260513, version 2, config.h's config
    with ``overrides``, e.g. ``magic=1`` or ``**SMALL_CONFIG``), then the weights in the loader's
    order: none (``weights=False``), ``init_weights(config, seed)`` (``True``) or the given
    dict (InfiniTrain's names, c_attn packed)."""
    config = dict(RUNTIME_CONFIG, **{k: v for k, v in overrides.items() if k not in ("magic", "version")})
    if weights is True:
        weights = init_weights(config, seed)
    with open(path, "wb") as f:
        f.write(header_ints(**overrides).tobytes())
        if weights:
            offsets: dict[str, int] = {}
            for name, shape, _ in tensor_layout(config):
                start = offsets.get(name, 0)
                rows = np.asarray(weights[name], dtype="<f4")[start:start + shape[0]] if len(shape) == 2 \
                    else np.asarray(weights[name], dtype="<f4")
                if rows.shape != shape:
                    raise ValueError(f"{path}: {name} rows {start}..{start + shape[0]} have shape {rows.shape}, "
                                     f"expected {shape}")
                f.write(np.ascontiguousarray(rows).tobytes())
                offsets[name] = start + shape[0]
    return str(path)


def _fmt(v) -> str:
    """A value as std::ostream prints it (floats %g, bools 0/1)."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _config_mode() -> str:
    mode = os.environ.get("STANDIN_MIXTRAL_CONFIG", "").strip()
    if mode not in CONFIG_MODES:
        sys.stderr.write(f"STANDIN_MIXTRAL_CONFIG must be empty (config.h's TinyMixtralConfig) or 'file' (a build "
                         f"compiled with the checkpoint's own config), not {mode!r}\n")
        sys.exit(2)
    return mode


def _router_order() -> str:
    plant = os.environ.get("STANDIN_PLANT_ROUTER", "").strip()
    if plant and plant not in ROUTER_PLANTS:
        sys.stderr.write(f"STANDIN_PLANT_ROUTER must be one of {', '.join(ROUTER_PLANTS)} (got {plant!r})\n")
        sys.exit(2)
    return "softmax_then_topk" if plant == "other_order" else "topk_then_softmax"


def read_header(path: str, log: Logger) -> dict:
    """ConfigFromLLMC (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:40-72): open, read
    the header, check magic / version, SanitizeTinyMixtralConfig; the header's config."""
    if not os.path.isfile(path):  # CHECK(ifs), checkpoint_loader.cc:42
        log.fatal(f"Check failed: ifs Failed to open tiny Mixtral LLMC file: {path}", f"{LOADER}:42")
    with open(path, "rb") as f:
        head = f.read(HEADER_INTS * 4)
    if len(head) < HEADER_INTS * 4:  # CHECK(ifs), checkpoint_loader.cc:44
        log.fatal(f"Check failed: ifs Failed to read tiny Mixtral LLMC header: {path}", f"{LOADER}:44")
    hi = np.frombuffer(head, np.int32)
    hf = np.frombuffer(head, np.float32)
    log.check_eq(int(hi[0]), MAGIC, "infini_train::BytesToType<int32_t>(header, 0 * sizeof(int32_t)) == "
                 "kTinyMixtralLLMCMagic", "", f"{LOADER}:45")
    log.check_eq(int(hi[1]), VERSION, "infini_train::BytesToType<int32_t>(header, 1 * sizeof(int32_t)) == "
                 "kTinyMixtralLLMCVersion", "", f"{LOADER}:46")
    c = {"block_size": int(hi[2]), "vocab_size": int(hi[3]), "original_vocab_size": int(hi[3]),
         "n_layer": int(hi[4]), "n_head": int(hi[5]), "n_kv_head": int(hi[6]), "n_embd": int(hi[7]),
         "ffn_expansion_ratio": float(hf[9]), "norm_eps": float(hf[12]), "rope_theta": float(hf[13]),
         "use_scaled_rope": int(hi[14]) != 0, "num_experts": int(hi[8]), "router_topk": int(hi[15]),
         "moe_ffn_hidden_size": int(hi[16])}
    _sanitize(c, log)  # checkpoint_loader.cc:70
    return c


def load_checkpoint(path: str, log: Logger, runtime: dict) -> dict[str, np.ndarray]:
    """LoadFromLLMC (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:99-165): CheckLLMCConfig
    (the header against ``runtime``, :74-97), then every tensor read in order, then no byte may
    follow. The weights under InfiniTrain's names (c_attn packed)."""
    c = read_header(path, log)
    for key in ("block_size", "vocab_size", "original_vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd",
                "ffn_expansion_ratio", "norm_eps", "rope_theta", "use_scaled_rope", "num_experts",
                "router_topk", "moe_ffn_hidden_size"):  # checkpoint_loader.cc:77-96
        want = runtime[key]
        got = c[key]
        if isinstance(want, float):  # compared as float32
            same = np.float32(got) == np.float32(want)
            got = float(np.float32(got))
            want = float(np.float32(want))
        else:
            same = got == want
        if not same:  # CompareCheckpointValue, checkpoint_loader.cc:34
            log.fatal(f"Check failed: checkpoint_value == runtime_value ({_fmt(got)} vs. {_fmt(want)}) "
                      f"{key} value from checkpoint ({_fmt(got)}) is not equal to runtime config value "
                      f"({_fmt(want)})", f"{LOADER}:34")
    size = os.path.getsize(path)
    data = np.memmap(path, dtype="<f4", mode="r", offset=HEADER_INTS * 4,
                     shape=((size - HEADER_INTS * 4) // 4,)) if size >= HEADER_INTS * 4 + 4 else np.zeros(0, "<f4")
    pieces: dict[str, list[np.ndarray]] = {}
    at = 0
    for name, shape, label in tensor_layout(runtime):
        n = int(np.prod(shape))
        if at + n > data.size:  # CHECK(ifs) after ReadMatrixAllFloat
            if label == name:
                log.fatal(f"Check failed: ifs Failed to read tensor {label}", f"{LOADER}:119")
            log.fatal(f"Check failed: ifs Failed to read tensor rows {label}", f"{LOADER}:135")
        pieces.setdefault(name, []).append(np.array(data[at:at + n], dtype=np.float32).reshape(shape))
        at += n
    end = HEADER_INTS * 4 + 4 * at
    if size > end:  # checkpoint_loader.cc:163
        with open(path, "rb") as f:
            f.seek(end)
            nxt = f.read(1)[0]
        log.check_eq(nxt, -1, "ifs.peek() == std::ifstream::traits_type::eof()",
                     "Unexpected trailing bytes in tiny Mixtral LLMC file", f"{LOADER}:163")
    return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in pieces.items()}


def _sanitize(c: dict, log: Logger) -> None:
    """SanitizeTinyMixtralConfig's checks on header values
    (feat/support_moe:example/tiny_mixtral/config.h:44-69; the type / bias / dispatcher checks
    can not fail for a header-read config)."""
    def gt(key, line, expr=None):
        log.check_op(c[key] > 0, f"{expr or 'c.' + key} > 0", _fmt(c[key]), 0, "", f"config.h:{line}")
    gt("block_size", 44)
    gt("vocab_size", 45)
    log.check_op(c["vocab_size"] >= c["original_vocab_size"], "c.vocab_size >= c.original_vocab_size",
                 c["vocab_size"], c["original_vocab_size"], "", "config.h:46")
    gt("n_layer", 47)
    gt("n_head", 48)
    gt("n_kv_head", 49)
    log.check_op(c["n_kv_head"] <= c["n_head"], "c.n_kv_head <= c.n_head", c["n_kv_head"], c["n_head"], "",
                 "config.h:50")
    log.check_eq(c["n_head"] % c["n_kv_head"], 0, "c.n_head % c.n_kv_head == 0",
                 "n_head must be divisible by n_kv_head for GQA", "config.h:51")
    gt("n_embd", 52)
    log.check_eq(c["n_embd"] % c["n_head"], 0, "c.n_embd % c.n_head == 0", "n_embd must be divisible by n_head",
                 "config.h:53")
    log.check(not c["use_scaled_rope"], "!c.use_scaled_rope",
              "tiny Mixtral precision validation keeps scaled RoPE disabled", "config.h:61")
    gt("num_experts", 65, "moe.num_experts")
    gt("router_topk", 67, "moe.router_topk")
    log.check_op(c["router_topk"] <= c["num_experts"], "moe.router_topk <= moe.num_experts", c["router_topk"],
                 c["num_experts"], "", "config.h:68")
    gt("moe_ffn_hidden_size", 69, "moe.moe_ffn_hidden_size")


def main(argv: list[str]) -> None:
    from .trainer import _build_opts, _die_no_cuda, read_tokens
    flavour, cuda, argv = _build_opts(argv)
    program = "tiny_mixtral"
    if argv and argv[0].startswith("@program:"):  # the build's name for it: tiny_mixtral or mixtral
        program, argv = argv[0].split(":", 1)[1], argv[1:]
    fl, _rest = gflags.parse_or_exit(argv, flag_set(), program)
    log = Logger(program, fl)
    mode = _config_mode()
    router_order = _router_order()
    runtime = dict(RUNTIME_CONFIG)  # TinyMixtralConfig(), main.cc:68
    weights = None
    if fl["llmc_filepath"]:  # main.cc:71-72
        if mode == "file":  # the emulated build's config.h is the file's own header
            runtime = read_header(fl["llmc_filepath"], log)
        weights = load_checkpoint(fl["llmc_filepath"], log, runtime)
    # ValidateRuntimeFlags, feat/support_moe:example/tiny_mixtral/main.cc:46-52
    log.check(fl["input_bin"] != "", "!FLAGS_input_bin.empty()", "tiny Mixtral training requires --input_bin",
              "main.cc:46")
    mb, gb, T = fl["micro_batch_size"], fl["global_batch_size"], fl["sequence_length"]
    log.check_op(mb > 0, "FLAGS_micro_batch_size > 0", mb, 0, "", "main.cc:47")
    log.check_op(gb > 0, "FLAGS_global_batch_size > 0", gb, 0, "", "main.cc:48")
    log.check_eq(gb % mb, 0, "FLAGS_global_batch_size % FLAGS_micro_batch_size == 0",
                 "global_batch_size must be divisible by micro_batch_size", "main.cc:49")
    log.check_op(T > 0, "FLAGS_sequence_length > 0", T, 0, "", "main.cc:51")
    block = runtime["block_size"]
    log.check_op(T <= block, "FLAGS_sequence_length <= config.block_size", T, block,
                 "sequence_length must be <= model max positions (block_size)", "main.cc:52")
    # device, feat/support_moe:example/tiny_mixtral/main.cc:78-85
    if fl["device"] == "cuda":
        if not cuda:
            _die_no_cuda(log)  # model->To(Device(kCUDA, 0)), main.cc:81
    else:
        log.check_op(fl["device"] == "cpu", 'FLAGS_device == "cpu"', fl["device"], "cpu",
                     f"Unsupported training device: {fl['device']}", "main.cc:83")
    toks = read_tokens(fl["input_bin"], log)  # TinyShakespeareDataset, main.cc:87-89
    if fl["dtype"] not in ("float32", "bfloat16"):  # main.cc:92-99
        log.fatal(f"Datatype {fl['dtype']} not supported.", "main.cc:98")
    bf16 = fl["dtype"] == "bfloat16"
    nbatches = (toks.size // T - 1) // mb
    log.check(nbatches >= 1, "dataset has at least one batch", f"({fl['input_bin']}: {toks.size} tokens)")
    if weights is None:
        sys.stderr.write("stand-in tiny_mixtral: no --llmc_filepath: InfiniTrain would train a fresh config.h "
                         "model (3.4 GB); the stand-in trains only models read from a file\n")
        sys.exit(2)
    if int(toks.max(initial=0)) >= runtime["vocab_size"]:
        sys.stderr.write(f"stand-in tiny_mixtral: token id {int(toks.max())} in {fl['input_bin']} is outside the "
                         f"model's {runtime['vocab_size']}-token vocabulary (InfiniTrain would read out of bounds)\n")
        sys.exit(2)

    import torch  # only a run that trains pays for it (--helpxml and the CHECKs above do not)

    from . import mixtral_math
    P = {k: torch.from_numpy(v).requires_grad_(True) for k, v in weights.items()}
    opt = mixtral_math.Adam(P, fl["learning_rate"])
    ga = gb // mb  # main.cc:108
    tokens_per_step = float(gb) * T  # main.cc:109
    durations = []
    batch = 0
    n_iter = fl["num_iteration"]
    for step in range(n_iter):
        t0 = time.perf_counter()
        opt.zero_grad()  # main.cc:114
        lossf = np.float32(0)
        for _ in range(ga):
            if batch == nbatches:  # main.cc:118-120: wrap to the loader's beginning
                batch = 0
            start = batch * mb * T
            chunk = torch.from_numpy(toks[start:start + mb * T + 1])
            batch += 1
            x, y = chunk[:-1].reshape(mb, T), chunk[1:].reshape(mb, T)
            loss = mixtral_math.loss(P, x, y, runtime, router_order, bf16)
            lossf = np.float32(lossf + np.float32(np.float32(loss.item()) / np.float32(ga)))  # main.cc:128
            (loss / float(ga)).backward()  # main.cc:129-131
        for _ in opt.step():  # main.cc:133
            log.info("Skipping param with null grad.", "optimizer.cc:60")
        dur_ms = (time.perf_counter() - t0) * 1e3
        durations.append(dur_ms)
        li = fl["log_interval"]
        if li > 0 and ((step + 1) % li == 0 or step + 1 == n_iter):  # main.cc:140-144
            # the rename adds peak memory (later@ed83c8b:example/mixtral/main.cc:155-159; 0 on CPU)
            peak = " | peak used:     0 MB | peak reserved:     0 MB" if program == "mixtral" else ""
            sys.stdout.write(f"step {step + 1:4d}/{n_iter} | train loss {float(lossf):.6f} | norm -1.0000 | "
                             f"lr {fl['learning_rate']:.2e} | ({dur_ms:.2f} ms | "
                             f"{tokens_per_step / (dur_ms / 1e3):.0f} tok/s{peak})\n")
            sys.stdout.flush()
    if durations:  # main.cc:147-155: the first step is left out of the average when there are more
        rest = durations[1:] if len(durations) > 1 else durations
        sys.stdout.write(f"final {len(rest)} iters avg: {sum(rest) / len(rest):.3f}ms\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
