"""The stand-in trainer: ``python -m tests.infinitrain_standin.trainer {gpt2|llama3} FLAGS...``
(what the build folder's ``gpt2`` / ``llama3`` scripts exec). See the package docstring."""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import sys
import time

import numpy as np

from . import gflags, lr_schedule, precision_check
from .gflags import Flag
from .glog import Logger, die_by_signal
from .model import Config, Model, Numerics, F32, dense, layer_linears, lora_init, param_names, \
    put, shard_index, take

# glog source positions, as in InfiniTrain's example/<model>/main.cc at b24d92f
STEP_LINE = {"gpt2": "main.cc:493", "llama3": "main.cc:470"}
MAIN = "main.cc:200"
CKPT = "checkpoint.cc:84"

GPT2_MODELS = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "d12", "d24", "d36", "d48"}
LLAMA3_MODELS = {"llama3"}


# example/<model>/main.cc:46-100 (gpt2) / :46-97 (llama3) at b24d92f: name, type, default, meaning
_MASTER_FLAGS = [
    ("input_bin", "string", "", "input .bin to train on"),
    ("input_val_bin", "string", "", "input .bin to eval validation loss on"),
    ("tokenizer_bin", "string", "", "input .bin to tokenizer"),
    ("llmc_filepath", "string", "", "llmc model file path to load from"),
    ("model", "string", None, None),
    ("batch_size", "uint32", 4, "batch size, in units of #batch dimensions"),
    ("sequence_length", "uint32", 64, "sequence length"),
    ("total_batch_size", "uint32", 256, "total desired batch size, in units of #tokens"),
    ("num_iteration", "uint32", 10, "number of iterations to run"),
    ("freq_generate_txt", "uint32", 10, "frequency of text generation"),
    ("text_length", "uint32", 64, "the length of the generated text"),
    ("learning_rate", "double", None, "learning rate warmup iterations"),
    ("zero_stage", "int32", 0, "ZeRO stage (0/1/2/3); 0 disables DistributedOptimizer"),
    ("val_loss_every", "uint32", 0, "every how many steps to evaluate val loss?"),
    ("sample_every", "uint32", 0, "how often to sample from the model?"),
    ("overfit_single_batch", "bool", True, "overfit just one batch of data"),
    ("device", "string", "cuda", "device type (cpu/cuda), useless if using parallel training mode"),
    ("nthread_per_process", "int32", 1, "Number of threads to use for each process. When set > 1, enables data "
     "parallelism with device=cuda on the specified number of visible CUDA devices."),
    ("tensor_parallel", "uint32", 1, "Tensor Parallel world size"),
    ("sequence_parallel", "bool", False, "Whether to enable Sequence Parallel"),
    ("pipeline_parallel", "uint32", 1, "Pipeline Parallel world size, specified the number of PP stages."),
    ("virtual_pipeline_parallel", "uint32", 1, "Number of chunks in PP stage."),
    ("dtype", "string", "float32", "precision used in training (float32/bfloat16)"),
    ("save_interval", "uint32", 0, "save checkpoint every N steps; 0 disables saving"),
    ("load", "string", "", "checkpoint directory to resume from"),
    ("save", "string", "", "root directory used to store checkpoints"),
    ("max_checkpoint_keep", "uint32", 3, "max number of checkpoint steps to keep"),
    ("save_optimizer_state", "bool", True, "whether optimizer state is persisted in checkpoints"),
    ("precision_check", "string", "", "precision check config: level=N,format=simple|table,output_md5=true|false,"
     "output_path=PATH,baseline=PATH"),
    ("lora_rank", "int32", 0, "LoRA rank (0 = disabled)"),
    ("lora_alpha", "double", 16.0, "LoRA alpha scaling factor"),
    ("lora_target_modules", "string", None, None),
    ("lora_save_path", "string", "", "Path to save LoRA weights after training"),
    ("lora_load_path", "string", "", "Path to load LoRA weights from"),
]
_PER_MODEL = {
    "gpt2": {"model": ("gpt2", "gpt2|gpt2-medium|gpt2-large|gpt2-xl|d12|d24|d36|d48"),
             "learning_rate": (1e-4, None),
             "lora_target_modules": ("c_attn,c_proj", "LoRA target modules (comma-separated: "
                                     "c_attn,c_proj,c_fc,c_fc2,mlp.c_proj)")},
    "llama3": {"model": ("llama3", "meta-llama/Meta-Llama-3.1-8B"),
               "learning_rate": (1e-5, None),
               "lora_target_modules": ("c_attn,c_proj,c_fc,c_fc2", "LoRA target modules (comma-separated)")},
}
# PR #209's additions. Its source (7a78e15 / 2209fe4) is not in the mirror read here, so these
# meanings are the stand-in's own words; the names, type (string) and empty defaults are the ones
# the harness relies on.
_PR209_FLAGS = [
    ("pipeline_layer_partition", "string", "", "comma-separated layer counts per pipeline chunk (or stage)"),
    ("pipeline_layer_costs", "string", "", "comma-separated per-layer costs used to balance the pipeline stages"),
    ("pipeline_chunk_layout", "string", "", "explicit layer-to-chunk layout of the pipeline"),
    ("pipeline_model_parallel_layout", "string", "", "Megatron-style pipeline model parallel layout"),
]
_PR209_GPT2 = [("dump_gradients", "string", "", "directory to dump every parameter gradient of the first step "
                "as .npy files (empty = disabled)")]
# The feature branches (facts read from each branch's example/<model>/main.cc DEFINE_*):
# name, type, default, meaning, (gpt2 line, llama3 line)
_LR_SCHEDULER_FLAGS = [  # feat/lr_scheduler:example/gpt2/main.cc:67-71, example/llama3/main.cc:66-70
    ("min_lr", "double", 0.0, "Minimum learning rate."),
    ("lr_decay_style", "string", "constant", "LR decay style: none|constant|linear|cosine|inverse-square-root"),
    ("lr_warmup_iters", "int64", 0, "Number of linear warmup iterations."),
    ("lr_warmup_init", "double", 0.0, "Initial learning rate at the start of warmup."),
    ("lr_decay_iters", "int64", 0, "Number of iterations to decay LR over (0 = num_iteration)."),
]
_CP_FLAGS = [  # feat/context_parallel:example/gpt2/main.cc:82-83, example/llama3/main.cc:81-82
    ("context_parallel", "uint32", 1, "Context Parallel world size"),
    ("cp_comm_type", "string", "p2p", "Context Parallel communication type (all_gather|p2p|a2a)"),
]
_RECOMPUTE_FLAGS = [  # feat/activation_checkpointing:example/gpt2/main.cc:83-86, example/llama3/main.cc:82-85
    ("activation_recompute", "bool", False, "Enable activation recompute to trade compute for memory."),
    ("recompute_granularity", "string", "full", "Activation recompute granularity: none|full|selective"),
    ("recompute_method", "string", "none", "Activation recompute method: none|uniform|block"),
    ("recompute_num_layers", "uint32", 0,
     "Number of transformer layers per recompute region for uniform/block methods."),
]
# feat/add_Qwen3-8B (older base): no save / load / zero_stage flags, use_distributed_optimizer instead
# (feat/add_Qwen3-8B:example/gpt2/main.cc:60, example/llama3/main.cc:59)
_QWEN3_DROPPED = ("load", "max_checkpoint_keep", "save", "save_interval", "save_optimizer_state", "zero_stage")
_QWEN3_FLAGS = [("use_distributed_optimizer", "bool", False,
                 "Whether to enable DistributedOptimizer(only take effects when DP>1)")]
FLAVOURS = ("master", "pr209", "lr_scheduler", "qwen3", "support_moe", "context_parallel", "activation_checkpointing")
# flags the code reads that a flavour may not define, with the value the code then assumes
_ABSENT_DEFAULTS = {"dump_gradients": "", "pipeline_layer_partition": "", "pipeline_layer_costs": "",
                    "pipeline_chunk_layout": "", "pipeline_model_parallel_layout": "", "load": "", "save": "",
                    "save_interval": 0, "max_checkpoint_keep": 3, "save_optimizer_state": True, "zero_stage": 0,
                    "context_parallel": 1, "cp_comm_type": "p2p", "activation_recompute": False,
                    "lr_decay_style": "none", "min_lr": 0.0, "lr_warmup_iters": 0, "lr_warmup_init": 0.0,
                    "lr_decay_iters": 0}


def flag_set(family: str, flavour: str = "pr209") -> dict[str, Flag]:
    """The flags ``example/<family>/main.cc`` DEFINEs in that flavour, plus gflags' own."""
    g = family == "gpt2"
    validators = {  # DEFINE_validator, main.cc:123-126 (gpt2) / :110-113 (llama3)
        "model": (lambda v: v in GPT2_MODELS) if g else (lambda v: v in LLAMA3_MODELS),
        "device": lambda v: v in ("cpu", "cuda"),
        "zero_stage": lambda v: 0 <= v <= 3,
        # feat/lr_scheduler:example/gpt2/main.cc:136-137 (llama3/main.cc:123-124)
        "lr_decay_style": lambda v: v in ("none", "constant", "linear", "cosine", "inverse-square-root"),
        # feat/context_parallel:example/gpt2/main.cc:132-134 (llama3/main.cc:120-122)
        "cp_comm_type": lambda v: v in ("all_gather", "p2p", "a2a"),
    }
    rows = list(_MASTER_FLAGS)
    if flavour == "pr209":
        rows += _PR209_FLAGS + (_PR209_GPT2 if g else [])
    elif flavour == "lr_scheduler":
        rows += _LR_SCHEDULER_FLAGS
    elif flavour == "qwen3":
        rows = [r for r in rows if r[0] not in _QWEN3_DROPPED] + _QWEN3_FLAGS
    elif flavour == "context_parallel":
        rows += _CP_FLAGS
    elif flavour == "activation_checkpointing":
        rows += _RECOMPUTE_FLAGS
    elif flavour not in ("master", "support_moe"):  # support_moe: master's gpt2 / llama3 flags exactly
        raise ValueError(f"unknown flavour {flavour!r}")
    out = {}
    for name, kind, default, meaning in rows:
        if name in _PER_MODEL[family]:
            d, m = _PER_MODEL[family][name]
            default = d
            meaning = m if m is not None else meaning
        if flavour == "lr_scheduler" and name == "learning_rate":
            meaning = "Peak learning rate."  # feat/lr_scheduler:example/gpt2/main.cc:64 (llama3:63)
        if flavour == "lr_scheduler" and name == "save":
            default = "./checkpoints"  # feat/lr_scheduler:example/gpt2/main.cc:93 (llama3:91)
        out[name] = Flag(name, kind, default, validators.get(name), meaning, f"example/{family}/main.cc")
    return gflags.with_gflags_flags(out)


# ---------------------------------------------------------------------------------------------
# files

def _gt(log, v, expr, where):
    log.check_op(v > 0, f"{expr} > 0", v, 0, "", where)


def read_checkpoint(path: str, family: str, log: Logger, tp: int = 1) -> tuple[Config, dict[str, np.ndarray]]:
    """LoadFromLLMC of example/<family>/checkpoint_loader.cc with its checks, in their order:
    the loader's own, Sanitize*Config (example/<family>/config.h), then the ones the
    TransformerModel constructor makes under TP (transformer.cc:208, causal_self_attention.cc:56-67,
    tensor_parallel.cc:276)."""
    g = family == "gpt2"
    if not path or not os.path.isfile(path):  # checkpoint_loader.cc:62 (gpt2) / :45 (llama3)
        log.fatal(f"File not found: {path}", "checkpoint_loader.cc:62" if g else "checkpoint_loader.cc:45")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 1024:
        log.fatal(f"Check failed: header read from {path} (file too small: {raw.size} bytes)",
                  "checkpoint_loader.cc:66" if g else "checkpoint_loader.cc:49")
    hu = raw[:1024].view(np.uint32)  # BytesToType<uint32_t>
    hf = raw[:1024].view(np.float32)
    data = raw[1024:]
    if data.size % 4:
        log.fatal(f"Check failed: file size of {path} is not a whole number of float32",
                  "checkpoint_loader.cc:66" if g else "checkpoint_loader.cc:49")
    data = data.view(np.float32)
    magic, version = int(hu[0]), int(hu[1])
    if g:
        log.check_eq(magic, 20240326, "magic == kHeaderMagic", "", "checkpoint_loader.cc:69")
        if version not in (3, 5):  # DetermineAndCheckVersion, checkpoint_loader.cc:52
            log.fatal(f"Unsupported version: {version} at example/gpt2/checkpoint_loader.cc:52",
                      "checkpoint_loader.cc:52")
        log.check_eq(version, 3, "version == kHeaderFP32Version", "", "checkpoint_loader.cc:71")
        T, V, L, H, C, Vp = (int(v) for v in hu[2:8])
        model_vocab = Vp if tp > 1 else V  # checkpoint_loader.cc:82
        # SanitizeGPT2Config, gpt2/config.h:29-36; n_kv_head is never read: GPT2Config()'s 12
        # (config.h:15), original_vocab_size = vocab_size (checkpoint_loader.cc:87)
        KV = 12
        _gt(log, T, "c.block_size", "config.h:29")
        _gt(log, model_vocab, "c.vocab_size", "config.h:30")
        log.check_op(model_vocab >= V, "c.vocab_size >= c.original_vocab_size", model_vocab, V, "", "config.h:31")
        _gt(log, L, "c.n_layer", "config.h:32")
        _gt(log, H, "c.n_head", "config.h:33")
        _gt(log, C, "c.n_embd", "config.h:34")
        log.check_eq(C % H, 0, "c.n_embd % c.n_head == 0", "n_embd must be divisible by n_head", "config.h:35")
        log.check_eq(KV, H, "c.n_kv_head == c.n_head", "GPT-2 does not use GQA; n_kv_head must equal n_head",
                     "config.h:36")
        _ctor_checks(log, model_vocab, H, KV, C, 4 * C, tp, gqa=False)
        cfg = Config("gpt2", T, V, L, H, C, Vp, n_kv_head=KV)
        shapes = [("transformer.wte.weight", (Vp, C)), ("transformer.wpe.weight", (T, C)),
                  ("ln_1.weight", (L, C)), ("ln_1.bias", (L, C)),
                  ("attn.c_attn.weight", (L, 3 * C, C)), ("attn.c_attn.bias", (L, 3 * C)),
                  ("attn.c_proj.weight", (L, C, C)), ("attn.c_proj.bias", (L, C)),
                  ("ln_2.weight", (L, C)), ("ln_2.bias", (L, C)),
                  ("mlp.c_fc.weight", (L, 4 * C, C)), ("mlp.c_fc.bias", (L, 4 * C)),
                  ("mlp.c_proj.weight", (L, C, 4 * C)), ("mlp.c_proj.bias", (L, C)),
                  ("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
        log.info(f"magic: {magic} version: {version} block_size: {T} vocab_size: {V} n_layer: {L} "
                 f"n_head: {H} n_embd: {C} padded_vocab_size: {Vp}", "checkpoint_loader.cc:94")
        log.check_eq(C % tp, 0, "n_embd % tp_size == 0", "n_embd must be divisible by TP world size.",
                     "checkpoint_loader.cc:98")
        log.check_eq(C % H, 0, "n_embd % n_head == 0", "n_embd must be divisible by n_head.",
                     "checkpoint_loader.cc:99")
        log.check_eq(H % tp, 0, "n_head % tp_size == 0", "n_head must be divisible by TP world size.",
                     "checkpoint_loader.cc:100")
    else:
        log.check_eq(magic, 20240803, "magic == kLLaMA3Magic", "", "checkpoint_loader.cc:52")
        log.check_eq(version, 3, "version == kLLaMA3FP32Version", "", "checkpoint_loader.cc:54")
        T, V, L, H, KV, C = (int(v) for v in hu[2:8])
        mult, multiple_of = float(hf[8]), int(hu[9])
        # SanitizeLLaMA3Config, llama3/config.h:29-45; original_vocab_size is never set by the
        # loader: LLaMA3Config()'s 128256 (config.h:12)
        orig = 128256
        _gt(log, T, "c.block_size", "config.h:29")
        _gt(log, V, "c.vocab_size", "config.h:30")
        log.check_op(V >= orig, "c.vocab_size >= c.original_vocab_size", V, orig, "", "config.h:31")
        _gt(log, L, "c.n_layer", "config.h:32")
        _gt(log, H, "c.n_head", "config.h:33")
        _gt(log, KV, "c.n_kv_head", "config.h:34")
        log.check_op(KV <= H, "c.n_kv_head <= c.n_head", KV, H, "", "config.h:35")
        log.check_eq(H % KV, 0, "c.n_head % c.n_kv_head == 0", "n_head must be divisible by n_kv_head for GQA",
                     "config.h:36")
        _gt(log, C, "c.n_embd", "config.h:37")
        log.check_eq(C % H, 0, "c.n_embd % c.n_head == 0", "n_embd must be divisible by n_head", "config.h:38")
        _gt(log, multiple_of, "c.multiple_of", "config.h:45")
        hidden = (2 * (4 * C)) // 3  # checkpoint_loader.cc:134-140 (llround)
        if mult > 0:
            hidden = int(math.floor(mult * hidden + 0.5))
        ffn = (hidden + multiple_of - 1) // multiple_of * multiple_of
        _ctor_checks(log, V, H, KV, C, ffn, tp, gqa=KV != H)
        for expr, v, msg, line in (("n_embd % tp_size == 0", C % tp, "n_embd must be divisible by TP world size.", 102),
                                   ("n_head % tp_size == 0", H % tp, "n_head must be divisible by TP world size.", 103),
                                   ("n_kv_head % tp_size == 0", KV % tp,
                                    "n_kv_head must be divisible by TP world size.", 104),
                                   ("vocab_size % tp_size == 0", V % tp,
                                    "vocab_size must be divisible by TP world size.", 105)):
            log.check_eq(v, 0, expr, msg, f"checkpoint_loader.cc:{line}")
        cfg = Config("llama3", T, V, L, H, C, V, n_kv_head=KV, ffn=ffn)
        kvd = cfg.kv_dim
        shapes = [("transformer.wte.weight", (V, C)), ("ln_1.weight", (L, C)),
                  ("attn.c_attn.weight", (L, C + 2 * kvd, C)), ("attn.c_proj.weight", (L, C, C)),
                  ("ln_2.weight", (L, C)), ("mlp.c_fc.weight", (L, ffn, C)),
                  ("mlp.c_fc2.weight", (L, ffn, C)), ("mlp.c_proj.weight", (L, C, ffn)),
                  ("transformer.ln_f.weight", (C,)), ("lm_head.weight", (V, C))]
        log.info(f"Model Config:\n  block_size         = {T}\n  vocab_size         = {V}\n"
                 f"  n_layer            = {L}\n  n_head             = {H}\n  n_kv_head          = {KV}\n"
                 f"  n_embd             = {C}", "checkpoint_loader.cc:110")
    need = sum(int(np.prod(s)) for _, s in shapes)
    if data.size != need:
        log.fatal(f"Check failed: size of {path} ({data.size} float32 after the header) == "
                  f"expected {need}", "checkpoint_loader.cc:150")
    params: dict[str, np.ndarray] = {}
    off = 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        arr = data[off:off + n].reshape(shape)
        off += n
        if name.startswith(("transformer.", "lm_head")):
            params[name] = arr.copy()
        else:
            for i in range(cfg.n_layer):
                params[f"transformer.h.{i}.{name}"] = arr[i].copy()
    if family == "gpt2":
        params["lm_head.weight"] = params["transformer.wte.weight"].copy()
    return cfg, {k: params[k] for k in param_names(cfg)}


def _ctor_checks(log, vocab, H, KV, C, ffn, tp, gqa):
    """The TransformerModel constructor's checks (only TP > 1 can fail them after Sanitize)."""
    log.check_eq(vocab % tp, 0, "config.vocab_size % tp_world_size == 0",
                 "Vocab size should be divisible by TP world size", "transformer.cc:208")
    log.check_eq(C % H, 0, "config.n_embd % config.n_head == 0", "n_embd must be divisible by n_head",
                 "causal_self_attention.cc:56")
    log.check_eq(H % tp, 0, "config.n_head % tp_world_size == 0", "n_head must be divisible by TP world size",
                 "causal_self_attention.cc:57")
    if gqa:
        log.check_eq(H % KV, 0, "config.n_head % config.n_kv_head == 0",
                     "n_head must be divisible by n_kv_head for GQA", "causal_self_attention.cc:66")
        log.check_eq(KV % tp, 0, "config.n_kv_head % tp_world_size == 0",
                     "n_kv_head must be divisible by TP world size for GQA", "causal_self_attention.cc:67")
    log.check_eq(ffn % tp, 0, "out_features % tp_size == 0",
                 "out_features must be divisible by TP world size for ColumnParallel", "tensor_parallel.cc:276")


def read_tokens(path: str, log: Logger) -> np.ndarray:
    if not path or not os.path.isfile(path):
        log.fatal(f"File not found: {path}", "tiny_shakespeare_dataset.cc:63")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 1024:
        log.fatal(f"Check failed: header of {path} (file too small)", "tiny_shakespeare_dataset.cc:68")
    hdr = raw[:1024].view(np.int32)
    magic, n = int(hdr[0]), int(hdr[2])
    if magic == 20240520:
        toks = raw[1024:1024 + 2 * n].view(np.uint16)
    elif magic == 20240801:
        toks = raw[1024:1024 + 4 * n].view(np.int32)
    else:
        log.fatal(f"Check failed: kTypeMap.contains(magic) unknown token file magic {magic} in {path}",
                  "tiny_shakespeare_dataset.cc:73")
    if toks.size != n:
        log.fatal(f"Check failed: token count of {path} ({toks.size} vs. {n})", "tiny_shakespeare_dataset.cc:80")
    return toks.astype(np.int64)


def save_npy(path: str, a: np.ndarray) -> None:
    """Bytes exactly as InfiniTrain's Tensor::SaveAsNpy writes them."""
    a = np.ascontiguousarray(a, dtype="<f4")
    dims = ", ".join(str(d) for d in a.shape)
    if a.ndim == 1:
        dims += ","
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + ") }"
    pad = 16 - ((10 + len(header) + 1) % 16)
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00")
        f.write(len(header).to_bytes(2, "little"))
        f.write(header.encode("latin1"))
        f.write(a.tobytes())


# ---------------------------------------------------------------------------------------------

class Topo:
    """Rank layout. With context parallelism (cp > 1) the order is TP, CP, DP, PP, fastest first
    (feat/context_parallel:infini_train/include/nn/parallel/global.h:17,
    feat/context_parallel:infini_train/src/nn/parallel/global.cc:17-46); cp == 1 is master's TP, DP, PP."""

    def __init__(self, world, tp, pp, vpp, cp=1):
        self.world, self.tp, self.pp, self.vpp, self.cp = world, tp, pp, vpp, cp
        self.dp = world // (tp * cp * pp)  # feat/context_parallel:infini_train/src/nn/parallel/global.cc:128

    def coords(self, g):
        return g % self.tp, (g // (self.tp * self.cp)) % self.dp, g // (self.tp * self.cp * self.dp)  # tp, dp, pp

    def cp_rank(self, g):
        return (g // self.tp) % self.cp


def parse_ints(text):
    return [int(s) for s in text.split(",") if s.strip() != ""]


def layer_stages(cfg: Config, fl: dict, pp: int, vpp: int, log: Logger) -> list[int]:
    """Stage of each layer. Uniform over pp*vpp chunks (chunk c on stage c % pp), or
    --pipeline_layer_partition (per chunk when it has pp*vpp entries, per stage when pp)."""
    L = cfg.n_layer
    nchunks = pp * vpp
    layouts = [k for k in ("pipeline_layer_partition", "pipeline_layer_costs", "pipeline_chunk_layout",
                           "pipeline_model_parallel_layout") if fl[k]]
    if len(layouts) > 1:
        log.fatal("Check failed: at most one pipeline layout flag may be set (got "
                  + ", ".join("--" + k for k in layouts) + ")")
    chunk_sizes = None
    if fl["pipeline_layer_partition"]:
        try:
            parts = parse_ints(fl["pipeline_layer_partition"])
        except ValueError:
            log.fatal(f"Check failed: invalid --pipeline_layer_partition '{fl['pipeline_layer_partition']}'")
        if sum(parts) != L or any(p < 0 for p in parts):
            log.fatal(f"Check failed: sum(pipeline_layer_partition) == n_layer ({sum(parts)} vs. {L})")
        if len(parts) == nchunks:
            chunk_sizes = parts
        elif len(parts) == pp and vpp == 1:
            chunk_sizes = parts
        else:
            log.fatal(f"Check failed: pipeline_layer_partition.size() == pp * vpp ({len(parts)} vs. {nchunks})")
    elif fl["pipeline_layer_costs"]:
        try:
            costs = [float(s) for s in fl["pipeline_layer_costs"].split(",")]
        except ValueError:
            log.fatal(f"Check failed: invalid --pipeline_layer_costs '{fl['pipeline_layer_costs']}'")
        if len(costs) != L or any(c <= 0 or not math.isfinite(c) for c in costs):
            log.fatal(f"Check failed: pipeline_layer_costs.size() == n_layer ({len(costs)} vs. {L})")
    elif fl["pipeline_chunk_layout"] or fl["pipeline_model_parallel_layout"]:
        text = fl["pipeline_chunk_layout"] or fl["pipeline_model_parallel_layout"]
        if not re.fullmatch(r"[A-Za-z0-9_*|,;:\s\-\[\]()]+", text):
            log.fatal(f"Check failed: malformed pipeline layout '{text}'")
    if chunk_sizes is None:
        if L % nchunks != 0:
            log.fatal(f"Check failed: n_layer % (pp * vpp) == 0 ({L % nchunks} vs. 0)")
        chunk_sizes = [L // nchunks] * nchunks
    stages = []
    for c, n in enumerate(chunk_sizes):
        stages += [c % pp] * n
    return stages


def param_stage(name: str, stages: list[int], pp: int) -> int:
    if name.startswith("transformer.h."):
        return stages[int(name.split(".")[2])]
    if name.startswith(("transformer.wte", "transformer.wpe")):
        return 0
    return pp - 1


def _build_opts(argv: list[str]) -> tuple[str, bool, list[str]]:
    """The build folder's scripts pass ``@build:<flavour>:<cuda|cpu>`` right after the family."""
    flavour, cuda = "pr209", True
    if argv and argv[0].startswith("@build:"):
        _, flavour, dev = argv[0].split(":")
        cuda = dev == "cuda"
        argv = argv[1:]
    return flavour, cuda, argv


def _die_no_cuda(log: Logger) -> None:
    # a CPU build registers no CUDA DeviceGuardImpl: GetDeviceGuardImpl(kCUDA) aborts
    # (infini_train/src/core/runtime/device_guard.cc:158-162; DeviceType kCUDA == 1)
    log.fatal("No DeviceGuardImpl registered for type 1", "device_guard.cc:161")


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("gpt2", "llama3"):
        sys.stderr.write("usage: python -m tests.infinitrain_standin.trainer {gpt2|llama3} FLAGS...\n")
        sys.exit(2)
    family = argv[0]
    flavour, cuda, rest_argv = _build_opts(argv[1:])
    fl, _rest = gflags.parse_or_exit(rest_argv, flag_set(family, flavour), family)
    fl["_flavour"], fl["_cuda"] = flavour, cuda
    for k, v in _ABSENT_DEFAULTS.items():
        fl.setdefault(k, v)
    log = Logger(family, fl)
    t_start = time.perf_counter()
    # PrecisionCheckConfig::Parse right after the flags (gpt2 main.cc:536): a bad level or
    # md5_tolerance throws, uncaught (precision_check.py)
    pc_config = precision_check.parse(fl["precision_check"])

    proc_world = int(os.environ.get("PROC_WORLD_SIZE", "1") or 1)
    proc_rank = int(os.environ.get("GLOBAL_PROC_RANK", "0") or 0)
    nthread = fl["nthread_per_process"]
    world = proc_world * nthread
    tp, pp, vpp = fl["tensor_parallel"], fl["pipeline_parallel"], fl["virtual_pipeline_parallel"]
    cp = fl["context_parallel"]
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        log.info(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")
    if flavour == "context_parallel":
        # GlobalEnv::Init on feat/context_parallel checks before it divides (no SIGFPE there):
        # feat/context_parallel:infini_train/src/nn/parallel/global.cc:116, :119, :122, :126-127
        log.check_op(tp >= 1, "tensor_parallel_size >= 1", tp, 1, "Tensor Parallel size must be >= 1", "global.cc:116")
        log.check_op(cp >= 1, "context_parallel_size >= 1", cp, 1, "Context Parallel size must be >= 1", "global.cc:119")
        log.check_op(pp >= 1, "pipeline_parallel_size >= 1", pp, 1, "Pipeline Parallel size must be >= 1",
                     "global.cc:122")
        log.check_eq(world % (tp * cp * pp), 0,
                     "world_size_ % (tensor_parallel_size_ * context_parallel_size_ * pipeline_parallel_size_) == 0",
                     "world_size must be divisible by TP * CP * PP", "global.cc:126")
    # GlobalEnv::Init (infini_train/src/nn/parallel/global.cc:102, 107): dp = world / tp / pp;
    # dp == 0 (or pp == 0) makes the layout divide by zero: SIGFPE, nothing on stderr, in
    # ProcessGroupOverview (main.cc:541 gpt2 / :518 llama3), before any rank starts
    log.check_op(tp >= 1, "tensor_parallel_size >= 1", tp, 1, "Tensor Parallel size must be >= 1", "global.cc:102")
    if pp == 0 or world // tp // pp == 0:
        die_by_signal(signal.SIGFPE)
    log.check(vpp >= 1 and nthread >= 1, "vpp >= 1 && nthread >= 1", "", "global.cc:100")
    log.check_eq(world % (tp * pp), 0, "world_size % (tensor_parallel_size * pipeline_parallel_size) == 0",
                 "", "global.cc:100")
    topo = Topo(world, tp, pp, vpp, cp)
    my_ranks = [proc_rank * nthread + t for t in range(nthread)]
    # PrecisionCheckEnv::Init after InitAllEnv (gpt2 main.cc:539): the timestamped folder
    fl["_pc"] = precision_check.PrecisionCheck(pc_config) if pc_config.level != 0 else None
    last_rank = world - 1
    log.info(f"world_size={world} DP={topo.dp} TP={tp} PP={pp} VPP={vpp} ranks={my_ranks}", "global.cc:110")

    # feat/lr_scheduler and feat/add_Qwen3-8B branched before master's --save / --save_interval check
    if last_rank in my_ranks and flavour not in ("lr_scheduler", "qwen3"):
        if fl["save"] and fl["save_interval"] == 0:
            log.fatal(f"Invalid configuration: --save is set ('{fl['save']}'), but --save_interval is 0. "
                      "They must be set together.", "main.cc:131")
        if not fl["save"] and fl["save_interval"] > 0:
            log.fatal(f"Invalid configuration: --save_interval is set to {fl['save_interval']}, but --save is "
                      "empty. They must be set together.", "main.cc:137")

    if world > 1 and not cuda:  # rank.IsParallel(): Device(kCUDA, ...) (gpt2 main.cc:172-174)
        _die_no_cuda(log)

    # NCCL unique-id files of the process groups whose first rank this process holds
    ccl_files: list[str] = []
    if world > 1:
        groups = []
        for g in my_ranks:
            t_, d_, p_ = topo.coords(g)
            c_ = topo.cp_rank(g)  # 0 unless context parallel; the ids reduce to master's when cp == 1
            if topo.dp > 1 and d_ == 0:
                groups.append(f"DP{(p_ * cp + c_) * tp + t_}")
            if tp > 1 and t_ == 0:
                groups.append(f"TP{(p_ * topo.dp + d_) * cp + c_}")
            if cp > 1 and c_ == 0:
                groups.append(f"CP{(p_ * topo.dp + d_) * tp + t_}")
            if pp > 1 and p_ == 0:
                groups.append(f"PP{(d_ * cp + c_) * tp + t_}")
        for gname in groups:
            path = f"cclUniqueId_{gname}.bin"
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                for p in ccl_files:
                    _unlink(p)
                log.fatal(f"Check failed: !std::filesystem::exists(\"{path}\") cclUniqueId file {path} "
                          f"already exists in {os.getcwd()} (another run in this folder?)", "ccl_utils.cc:22")
            os.write(fd, os.urandom(128))
            os.close(fd)
            ccl_files.append(path)

    try:
        _train(family, fl, log, topo, my_ranks, last_rank, t_start)
    finally:
        for p in ccl_files:
            _unlink(p)


def _unlink(p):
    try:
        os.unlink(p)
    except OSError:
        pass


def _train(family, fl, log, topo: Topo, my_ranks, last_rank, t_start):
    tp, pp, dp, world, cp = topo.tp, topo.pp, topo.dp, topo.world, topo.cp
    B, T = fl["batch_size"], fl["sequence_length"]
    g2 = family == "gpt2"
    if fl["_flavour"] == "context_parallel":
        # feat/context_parallel:example/gpt2/main.cc:166-176 (llama3/main.cc:154-164)
        if cp > 1:
            log.check_eq(T % cp, 0, "FLAGS_sequence_length % cp_world_size == 0",
                         "sequence_length must be divisible by context_parallel.", "main.cc:167" if g2 else "main.cc:155")
        if fl["sequence_parallel"]:
            log.check_eq((T // cp) % tp, 0, "cp_local_sequence_length % tp_world_size == 0",
                         "CP-local sequence_length must be divisible by tp_world_size when SP is enabled.",
                         "main.cc:170" if g2 else "main.cc:158")
        if fl["zero_stage"] >= 1:
            log.check_op(dp * cp > 1, "dp_cp_world_size > 1", dp * cp, 1,
                         "ZeRO requires DP or CP world size greater than 1.", "main.cc:174" if g2 else "main.cc:162")
            log.check_op(fl["zero_stage"] <= 2, "FLAGS_zero_stage <= 2", fl["zero_stage"], 2,
                         "ZeRO-3 is not supported yet.", "main.cc:175" if g2 else "main.cc:163")
    elif fl["sequence_parallel"]:
        log.check_eq(T % tp, 0, "FLAGS_sequence_length % tp_world_size == 0",
                     "sequence_length must be divisible by tp_world_size when SP is enabled (pad later if needed).",
                     "main.cc:160")
    tokens_per_fwdbwd = B * T * dp
    log.check(tokens_per_fwdbwd > 0, "tokens_per_fwdbwd > 0")
    log.check_eq(fl["total_batch_size"] % tokens_per_fwdbwd, 0, "FLAGS_total_batch_size % tokens_per_fwdbwd == 0",
                 "", "main.cc:202")
    ga = fl["total_batch_size"] // tokens_per_fwdbwd
    log.check(ga >= 1, "grad_accum_steps >= 1", f"(total_batch_size {fl['total_batch_size']} < "
              f"{tokens_per_fwdbwd})", "main.cc:203")
    log.info(f"total desired batch size: {fl['total_batch_size']} => calculated gradient accumulation steps: {ga}",
             "main.cc:205")

    recompute_selective = False
    if fl["_flavour"] == "activation_checkpointing":
        # nn::SetActivationRecomputeConfig before the loader (feat/activation_checkpointing:
        # example/gpt2/main.cc, example/llama3/main.cc), checks of
        # feat/activation_checkpointing:infini_train/src/nn/modules/transformer/transformer_config.cc:58-84
        recompute_selective = _recompute_config(fl, log)
    cfg, P = read_checkpoint(fl["llmc_filepath"], family, log, tp)
    if family == "gpt2":
        log.check(T <= cfg.block_size, "sequence_length <= block_size", f"({T} vs. {cfg.block_size})")
    if not fl["_cuda"] and fl["device"] == "cuda":
        _die_no_cuda(log)  # single device: model->To(Device(kCUDA, 0)) (gpt2 main.cc:198, 223)
    stages = layer_stages(cfg, fl, pp, topo.vpp, log)

    dtype = fl["dtype"]
    if dtype not in ("float32", "bfloat16"):
        log.fatal(f"Rank {my_ranks[0]}: Datatype {dtype} not supported.", "main.cc:247")

    # LoRA
    lora_mods: set[str] = set()
    if fl["lora_rank"] > 0:
        targets = [t.strip() for t in fl["lora_target_modules"].split(",") if t.strip()]
        r = fl["lora_rank"]
        for i in range(cfg.n_layer):
            for mod in layer_linears(cfg, i):
                if any(mod == t or mod.endswith("." + t) for t in targets):
                    lora_mods.add(mod)
                    W = P[mod + ".weight"]
                    P[mod + ".lora_A"] = lora_init(mod + ".lora_A", r, W.shape[1])
                    P[mod + ".lora_B"] = np.zeros((W.shape[0], r), F32)
        log.info(f"LoRA: rank={r} alpha={fl['lora_alpha']} targets={','.join(targets)} "
                 f"modules={len(lora_mods)}", "lora_utils.cc:400")
    num = Numerics(tp=tp, bf16=dtype == "bfloat16",
                   lora_scale=(fl["lora_alpha"] / fl["lora_rank"]) if fl["lora_rank"] > 0 else 0.0,
                   lora_modules=lora_mods, frozen_base=bool(lora_mods),
                   plant_module=precision_check.plant_module(family, cfg.n_layer))
    model = Model(cfg, P, num)
    if fl["_flavour"] == "master" and family == "gpt2" and tp > 1 and cfg.padded_vocab_size < 50257:
        # master's gpt2 builds VocabParallelCrossEntropyLoss(model_config.original_vocab_size) from
        # GPT2Config() (main.cc:212, 336), never the file's: 50257 > the padded vocabulary fails
        # in the first forward (tensor_parallel.cc:463)
        for g_ in my_ranks:
            log.info(f"Rank {g_}: start forward", "main.cc:445")
        log.check_op(False, "vocab_size_original_ <= vocab_size_global_", 50257, cfg.padded_vocab_size,
                     "Original vocab size should be <= padded vocab size", "tensor_parallel.cc:463")
    names = [n for n in P if (n.endswith(("lora_A", "lora_B")) if lora_mods else True)]
    log.info(f"Optimizing {len(names)} {'LoRA' if lora_mods else 'model'} parameters", "main.cc:264")
    lrs = None
    if fl["_flavour"] == "lr_scheduler":
        # CreateLRScheduler after the optimizer (feat/lr_scheduler:example/gpt2/main.cc:328-336,
        # llama3/main.cc:308-316)
        decay = lr_schedule.decay_iters(fl["lr_decay_iters"], fl["num_iteration"])
        bad = lr_schedule.check(fl["lr_decay_style"], fl["learning_rate"], fl["min_lr"], fl["lr_warmup_iters"],
                                fl["lr_warmup_init"], decay)
        if bad:
            expr, a, b, msg, where = bad
            log.check_op(False, expr, a, b, msg, where)
        lrs = lr_schedule.schedule(fl["lr_decay_style"], fl["learning_rate"], fl["min_lr"], fl["lr_warmup_iters"],
                                   fl["lr_warmup_init"], decay, fl["num_iteration"], plant=_lr_plant())

    toks = read_tokens(fl["input_bin"], log)
    nseq = toks.size // T
    num_samples = nseq - 1
    nbatches = num_samples // B
    log.check(nbatches >= 1, "dataset has at least one batch", f"({fl['input_bin']}: {toks.size} tokens)")
    pos = np.tile(np.arange(T), B)

    def unit_batch(u):
        u = u % nbatches
        start = u * B * T
        chunk = toks[start:start + B * T + 1]
        return chunk[:-1], chunk[1:]

    # resume
    start_step = 0
    if fl["load"]:
        start_step = _load_checkpoint(fl["load"], log, cfg, P, topo, stages, lora_mods)

    # planted faults
    plant = os.environ.get("STANDIN_PLANT", "")
    plant_name, plant_scale = None, 0.0
    if plant and world > 1:
        plant_name, _, sc = plant.rpartition(":")
        plant_scale = float(sc)
    plant_ranks = _plant_ranks(os.environ.get("STANDIN_PLANT_RANKS", "all"), tp)
    # STANDIN_PLANT_RECOMPUTE=<scale>: a planted activation-recompute bug, on every run that
    # recomputes (one device too): the updates are scaled by 1 + scale.
    recompute_plant = float(os.environ.get("STANDIN_PLANT_RECOMPUTE", "0") or 0) \
        if fl.get("activation_recompute") else 0.0
    crash_signal = os.environ.get("STANDIN_CRASH_SIGNAL", "").strip().upper().removeprefix("SIG")
    if crash_signal and crash_signal not in ("SEGV", "ABRT", "FPE"):
        sys.stderr.write(f"STANDIN_CRASH_SIGNAL must be SEGV, ABRT or FPE (got {crash_signal!r})\n")
        sys.exit(2)
    bf16_broken = (os.environ.get("STANDIN_CPU_BF16_BROKEN", "") not in ("", "0") and dtype == "bfloat16"
                   and (fl["device"] == "cpu" or not fl["_cuda"]) and world == 1)
    crash_rank = os.environ.get("STANDIN_CRASH_RANK", "")
    crash_rank = int(crash_rank) if crash_rank.strip() else (0 if crash_signal else None)
    crash_step = int(os.environ.get("STANDIN_CRASH_STEP", "1") or 1)
    no_step_lines = os.environ.get("STANDIN_NO_STEP_LINES", "") not in ("", "0")
    sleep_s = float(os.environ.get("STANDIN_SLEEP", "0") or 0)
    if sleep_s > 0:
        time.sleep(sleep_s)

    for g in my_ranks:
        log.info(f"Rank {g}: start training", "main.cc:339" if family == "gpt2" else "main.cc:318")
    if family == "gpt2":
        log.info("start training", "main.cc:389")
    where = _LOOP_LINES[family]
    nmb = ga  # microbatches per DP rank per step
    lr = F32(fl["learning_rate"])
    ga_ref = ga * dp
    # gpt2 in bf16 on CPU prints "-nan" and often segfaults at a varying step
    bf16_crash_at = 2 + os.getpid() % 4
    nparams = sum(a.size for a in P.values())
    used_mb = max(1, int(math.ceil(nparams * 4 * 3 / 2**20)))
    reserved_mb = used_mb + 2

    pc = fl["_pc"]
    for step in range(start_step, fl["num_iteration"]):
        t0 = time.perf_counter()
        if pc is not None:
            pc.reset_counters()
        crash_here = crash_rank is not None and crash_rank in my_ranks and step + 1 == crash_step
        if crash_here and not crash_signal:
            log.fatal(f"Check failed: planted crash on rank {crash_rank}", "main.cc:420")
        if crash_here or (bf16_broken and family == "llama3"):
            # a crash inside the step, as a C++ fault: the INFO line is written (buffered in the
            # log file unless GLOG_logbuflevel=-1), then the signal, nothing on stderr. LLaMA 3
            # in bf16 on CPU segfaults in its first forward the same way.
            log.info(f"Rank {crash_rank if crash_here else my_ranks[0]}: start forward", where[0])
            die_by_signal(getattr(signal, "SIG" + (crash_signal if crash_here else "SEGV")))
        if bf16_broken and step - start_step + 1 == bf16_crash_at:
            log.info(f"Rank {my_ranks[0]}: start forward", where[0])
            die_by_signal(signal.SIGSEGV)
        if recompute_selective:
            # the first forward under grad mode: feat/activation_checkpointing:
            # infini_train/src/nn/modules/transformer/transformer.cc:56-57
            for g_ in my_ranks:
                log.info(f"Rank {g_}: start forward", where[0])
            log.fatal("Selective activation recompute is not implemented yet. Use full layer recompute.",
                      "transformer.cc:57")
        # gradients, grouped as the topology groups them; with CP each (DP, CP) rank takes its
        # contiguous 1/cp of every sequence (SliceAlongCPRegionFunc(x, 1),
        # feat/context_parallel:example/gpt2/main.cc) and the loss and gradients are averaged
        # over the DP x CP group (dp_cp_pg)
        rank_grads, rank_losses = [], []
        for d, c in [(d, c) for d in range(dp) for c in range(cp)]:
            if pp == 1:
                js = [d + dp * k for k in range(nmb)]
            else:
                js = [d * nmb + k for k in range(nmb)]
            per = []
            lossf = F32(0)
            # the global ranks of this process that run DP rank d (their trace entries)
            pc_ranks = [g_ for g_ in my_ranks if topo.coords(g_)[1] == d and topo.cp_rank(g_) == c] \
                if pc is not None else []
            pc_buf = {g_: ([], []) for g_ in pc_ranks}
            for j in js:
                x, y = unit_batch(step * ga_ref + j)
                xpos = pos
                if cp > 1:
                    sl = slice(c * T // cp, (c + 1) * T // cp)
                    x, y, xpos = (a.reshape(B, T)[:, sl].reshape(-1) for a in (x, y, pos))
                if pp == 1:
                    for g_ in my_ranks:
                        log.info(f"Rank {g_}: start forward", where[0])
                trace = {} if pc_ranks else None
                loss, g = model.forward_backward(x, y, xpos, 1.0 / nmb, trace=trace)
                if trace is not None:
                    _trace_entries(pc, pc_buf, trace, cfg, topo, stages, B, x.shape[0] // B)
                if pp == 1:
                    for g_ in my_ranks:
                        log.info(f"Rank {g_}: finish backward", where[1])
                lossf = F32(lossf + F32(loss / F32(nmb)))
                per.append(g)
            for g_, (fw, bw) in pc_buf.items():  # PP (GPipe): the forwards, then the backwards
                for name, a in fw:
                    pc.write(g_, name, "forward", a)
                for name, a in bw:
                    pc.write(g_, name, "backward", a)
            if pp > 1:  # the schedule's accumulation: pairwise
                while len(per) > 1:
                    nxt = [_add(per[i], per[i + 1]) for i in range(0, len(per) - 1, 2)]
                    if len(per) % 2:
                        nxt.append(per[-1])
                    per = nxt
                acc = per[0]
            else:
                acc = per[0]
                for g in per[1:]:
                    acc = _add(acc, g)
            rank_grads.append(acc)
            rank_losses.append(lossf)
        if dp * cp > 1:  # all-reduce average: a reduction tree over the DP (x CP) ranks, then / dp
            # lm_head's and the embedding's gradients stay factored through the tree (the DP
            # ranks of a step share its head forward) and are made dense once: LLaMA 3's
            # vocabulary-sized matrices made dense per rank and then summed were over half of
            # a DP 8 run's time
            while len(rank_grads) > 1:
                nxt = [_add(rank_grads[i], rank_grads[i + 1]) for i in range(0, len(rank_grads) - 1, 2)]
                if len(rank_grads) % 2:
                    nxt.append(rank_grads[-1])
                rank_grads = nxt
            grads = dense(rank_grads[0])
            grads = {k: (v / F32(dp * cp)).astype(F32) for k, v in grads.items()}
            lossf = F32(0)
            for l_ in rank_losses:
                lossf = F32(lossf + l_)
            lossf = F32(lossf / F32(dp * cp))
        else:
            grads, lossf = dense(rank_grads[0]), rank_losses[0]
        planted = grads
        if recompute_plant:  # a recompute bug: the recomputed forward is off, every update moves
            planted = {k: (v * np.float32(1.0 + recompute_plant)).astype(v.dtype)
                       for k, v in grads.items()}
        if plant_name is not None and plant_name in grads and plant_ranks:
            planted = dict(grads)
            planted[plant_name] = _plant(grads[plant_name], plant_name, plant_scale, plant_ranks, cfg, tp)
        step_lr = lr if lrs is None else lrs[step]  # the scheduled lr (feat/lr_scheduler:example/gpt2/main.cc:428)
        model.apply_update(planted, step_lr)  # SGD
        if fl["dump_gradients"] and step == 0:
            # #209 dumps when the loop's step index is 0: the first step of a run from scratch
            # only (a run resumed with --load starts at its checkpoint's step and dumps nothing)
            _dump(fl["dump_gradients"], grads, planted, plant_ranks, cfg, topo, my_ranks, stages)
        dur = time.perf_counter() - t0
        if last_rank in my_ranks and not no_step_lines:
            sp = tp if fl["sequence_parallel"] else 1
            loss_text = "-nan" if bf16_broken else f"{float(lossf):.6f}"
            # feat/context_parallel prints CP between SP and PP (feat/context_parallel:example/gpt2/main.cc:538)
            cp_text = f"CP={cp}, " if fl["_flavour"] == "context_parallel" else ""
            lr_text = f"{fl['learning_rate']:.2e}" if lrs is None else f"{float(lrs[step]):.2e}"
            log.error(f"step {step + 1:4d}/{fl['num_iteration']} | train loss {loss_text} | "
                      f"lr {lr_text} | ({dur * 1e3:.2f} ms | "
                      f"{fl['total_batch_size'] / max(dur, 1e-9):.0f} tok/s | peak used: {used_mb:5d} MB | "
                      f"peak reserved: {reserved_mb:5d} MB, DP={dp}, TP={tp}, SP={sp}, {cp_text}PP={pp})",
                      STEP_LINE[family])
        if fl["_flavour"] == "lr_scheduler":
            if fl["save_interval"] > 0 and (step + 1) % fl["save_interval"] == 0:  # gpt2/main.cc:520
                consumed = ((dp - 1) + dp * (step + 1) * (nmb if pp == 1 else 1))
                _save_checkpoint(fl, log, cfg, P, topo, my_ranks, last_rank, stages, step + 1, consumed)
        elif fl["save"] and fl["save_interval"] > 0:
            if (step + 1) % fl["save_interval"] == 0 or step + 1 == fl["num_iteration"]:
                consumed = ((dp - 1) + dp * (step + 1) * (nmb if pp == 1 else 1))
                _save_checkpoint(fl, log, cfg, P, topo, my_ranks, last_rank, stages, step + 1, consumed)
    if fl["lora_save_path"] and lora_mods and last_rank in my_ranks:
        np.savez(fl["lora_save_path"], **{k: v for k, v in P.items() if k.endswith(("lora_A", "lora_B"))})
    if fl["_flavour"] == "lr_scheduler":
        # every run ends with <save>/checkpoint_final (default ./checkpoints):
        # feat/lr_scheduler:example/gpt2/main.cc:536-540 (llama3/main.cc:513-517)
        n = fl["num_iteration"]
        _save_checkpoint(fl, log, cfg, P, topo, my_ranks, last_rank, stages, n,
                         (dp - 1) + dp * n * (nmb if pp == 1 else 1), final=True,
                         lr_value=float(lrs[-1]) if lrs else fl["learning_rate"])
    log.info(f"done in {time.perf_counter() - t_start:.3f} s", "main.cc:540")


def _trace_entries(pc, buf, trace, cfg, topo: Topo, stages, B, T):
    """One microbatch's trace entries for each rank in ``buf``: written at once without PP
    (forward then backward), kept for the end of the step's microbatches under PP (the GPipe
    schedule: every forward, then every backward)."""
    for g_, (fw, bw) in buf.items():
        t_, _d, p_ = topo.coords(g_)
        layers = [i for i, s_ in enumerate(stages) if s_ == p_]
        f_, b_ = pc.entries(trace, cfg, B, T, topo.tp, t_, layers, p_ == 0, p_ == topo.pp - 1, topo.pp == 1)
        if topo.pp == 1:
            for name, a in f_:
                pc.write(g_, name, "forward", a)
            for name, a in b_:
                pc.write(g_, name, "backward", a)
        else:
            fw += f_
            bw += b_


def _lr_plant() -> str | None:
    """STANDIN_PLANT_LR: a planted schedule bug (lr_schedule.PLANTS), in every run of the
    lr_scheduler flavour, one device too; unset or empty plants none."""
    value = os.environ.get("STANDIN_PLANT_LR", "").strip()
    if value and value not in lr_schedule.PLANTS:
        sys.stderr.write(f"STANDIN_PLANT_LR must be one of {', '.join(lr_schedule.PLANTS)} (got {value!r})\n")
        sys.exit(2)
    return value or None


def _recompute_config(fl, log) -> bool:
    """SetActivationRecomputeConfig's parsing and checks
    (feat/activation_checkpointing:infini_train/src/nn/modules/transformer/transformer_config.cc:58-84,
    ParseEnum's LOG(FATAL) at :21). True when the granularity is ``selective``, which the first
    forward refuses (transformer.cc:56-57). Recompute changes no number."""
    if not fl["activation_recompute"]:
        return False
    gran = fl["recompute_granularity"]
    if gran not in ("none", "full", "selective"):
        log.fatal(f"Unknown recompute_granularity: {gran}. Expected none|full|selective.", "transformer_config.cc:21")
    if gran != "full":
        return gran == "selective"
    method = fl["recompute_method"]
    if method not in ("none", "uniform", "block"):
        log.fatal(f"Unknown recompute_method: {method}. Expected none|uniform|block.", "transformer_config.cc:21")
    if method != "none":
        n = fl["recompute_num_layers"]
        log.check_op(n >= 1, "num_layers >= 1", n, 1,
                     "recompute_num_layers must be >= 1 when recompute_method is uniform or block.",
                     "transformer_config.cc:82")
    return False


def _add(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out else v
    return out


def _held(name, cfg, topo: Topo, g, stages):
    t_, d_, p_ = topo.coords(g)
    return param_stage(name, stages, topo.pp) == p_


# LOG(INFO) "start forward" / "finish backward" in the micro-step loop
_LOOP_LINES = {"gpt2": ("main.cc:445", "main.cc:463"), "llama3": ("main.cc:423", "main.cc:440")}


def _plant_ranks(text: str, tp: int) -> set[int]:
    """STANDIN_PLANT_RANKS: ``all`` or a comma list of TP ranks (``r0,r1`` or ``0,1``)."""
    text = text.strip().lower()
    if text in ("", "all"):
        return set(range(tp))
    out = set()
    for part in text.split(","):
        part = part.strip().removeprefix("r")
        if part:
            out.add(int(part))
    return {r for r in out if 0 <= r < tp}


def _plant(g: np.ndarray, name: str, scale: float, ranks: set[int], cfg, tp: int) -> np.ndarray:
    """The planted TP reduction bug: the listed TP ranks' copies of the gradient scaled by
    (1 + scale). A replicated parameter has one copy per rank; the stand-in keeps one copy of the
    weights, which takes the planted update when any rank is planted. A sharded one: the listed
    ranks' slices."""
    f = F32(1.0 + scale)
    if shard_index(cfg, name, g.shape, tp, 0) is None or tp == 1:
        return (g * f).astype(F32)
    out = g.copy()
    for r in sorted(ranks):
        idx = shard_index(cfg, name, g.shape, tp, r)
        put(out, idx, (take(g, idx) * f).astype(F32))
    return out


def _writer_order(holders: list[int], name: str) -> int:
    """Whose write of a file lands last. Every rank writes each gradient under its full name
    (#209's DumpGradients), so the survivor is whichever write lands last; the stand-in lets
    exactly one of the holders write. STANDIN_SHARD_WRITER=random (default) | highest | lowest.
    random is seeded from the process id (under infini_run from the launcher's, which every
    child shares, so the processes agree on one writer)."""
    mode = os.environ.get("STANDIN_SHARD_WRITER", "random").strip().lower()
    if mode == "highest":
        return max(holders)
    if mode == "lowest":
        return min(holders)
    seed = os.getppid() if int(os.environ.get("PROC_WORLD_SIZE", "1") or 1) > 1 else os.getpid()
    return random.Random(f"{seed}:{name}").choice(sorted(holders))


def _dump(dirname, grads, planted, plant_ranks, cfg, topo: Topo, my_ranks, stages):
    """#209's dump: each rank's gradients as ``<name>.npy`` (SaveAsNpy bytes). A parameter TP
    does not shard (norms, row-parallel biases, wpe) is whole on every TP rank and written whole;
    a sharded one is the writer's TP shard: c_attn [q_r | k_r | v_r] rows, c_fc / c_fc2 rows,
    c_proj weight columns, wte / lm_head rows of the padded vocabulary (model.shard_index)."""
    os.makedirs(dirname, exist_ok=True)
    for name in sorted(grads):
        holders = [g for g in range(topo.world) if _held(name, cfg, topo, g, stages)]
        writer = _writer_order(holders, name)
        if writer not in my_ranks:
            continue
        t_ = topo.coords(writer)[0]
        src = planted if (t_ in plant_ranks and name in planted) else grads
        g = src[name]
        idx = shard_index(cfg, name, g.shape, topo.tp, t_)
        path = os.path.join(dirname, name + ".npy")
        tmp = f"{path}.{os.getpid()}.tmp"
        save_npy(tmp, take(g, idx))
        os.replace(tmp, path)  # one whole file, whoever writes it


def _rank_dir(root, step, topo, g, final=False):
    d = os.path.join(root, "checkpoint_final" if final else f"checkpoint_step_{step:06d}")
    if topo.world > 1:
        d = os.path.join(d, f"rank_{g:06d}")
    return d


def _save_checkpoint(fl, log, cfg, P, topo: Topo, my_ranks, last_rank, stages, step, consumed, final=False,
                     lr_value=None):
    t0 = time.perf_counter()
    for g in my_ranks:
        d = _rank_dir(fl["save"], step, topo, g, final)
        log.info(f"[CKPT] Save begin: dir={d}, global_step={step}", "checkpoint.cc:68")
        os.makedirs(d, exist_ok=True)
        t_ = topo.coords(g)[0]
        mine = {n: take(a, shard_index(cfg, n, a.shape, topo.tp, t_)) for n, a in P.items()
                if _held(n, cfg, topo, g, stages)}
        with open(os.path.join(d, "model.ckpt"), "wb") as f:
            np.savez(f, **mine)
        if fl["save_optimizer_state"]:
            with open(os.path.join(d, "optimizer.ckpt"), "wb") as f:
                np.savez(f)  # SGD: no state
        sp = topo.tp if fl["sequence_parallel"] else 1
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            # InfiniTrain's SaveTrainerState writes this exact text (note: no comma after vocab_size)
            f.write("{\n"
                    f"  \"n_layer\": {cfg.n_layer},\n  \"n_head\": {cfg.n_head},\n"
                    f"  \"n_kv_head\": {cfg.n_kv_head},\n  \"n_embd\": {cfg.n_embd},\n"
                    f"  \"vocab_size\": {_vocab(cfg, topo)}\n"
                    f"  \"global_step\": {step},\n  \"consumed_batches\": {consumed},\n"
                    f"  \"last_lr\": {fl['learning_rate'] if lr_value is None else lr_value:g},\n"
                    f"  \"ddp_size\": {topo.dp},\n"
                    f"  \"tp_size\": {topo.tp},\n  \"sp_size\": {sp},\n  \"pp_size\": {topo.pp}\n"
                    "}\n")
        log.error(f"[CKPT] Save done: dir={d}", CKPT)
    if last_rank in my_ranks:
        keep = fl["max_checkpoint_keep"]
        root = fl["save"]
        steps = sorted(e for e in os.listdir(root) if e.startswith("checkpoint_step_")
                       and os.path.isdir(os.path.join(root, e)))
        if keep > 0:
            for e in steps[:-keep]:
                shutil.rmtree(os.path.join(root, e), ignore_errors=True)
        log.info(f"Checkpoint saved at: {_rank_dir(root, step, topo, last_rank, final)} "
                 f"({(time.perf_counter() - t0) * 1e3:.2f} ms)", "checkpoint_manager.cc:100")


def _vocab(cfg, topo):
    if cfg.family == "gpt2":
        return cfg.padded_vocab_size if topo.tp > 1 else cfg.vocab_size
    return cfg.vocab_size


def _field(text, key):
    m = re.search(r'"' + key + r'"\s*:\s*([-+0-9.eE]+)', text)
    return float(m.group(1)) if m else 0


def _load_checkpoint(root, log, cfg, P, topo: Topo, stages, lora_mods) -> int:
    if not os.path.isdir(root):
        log.fatal(f"Check failed: std::filesystem::exists(resume_dir) Checkpoint directory not found: {root}",
                  "checkpoint_manager.cc:30")
    state = None
    for g in range(topo.world):
        d = root if topo.world == 1 else os.path.join(root, f"rank_{g:06d}")
        mp = os.path.join(d, "model.ckpt")
        if not os.path.isfile(mp):
            log.fatal(f"Check failed: ifs.is_open() Failed to open checkpoint file: {mp}", "checkpoint.cc:144")
        t_ = topo.coords(g)[0]
        with np.load(mp) as z:
            for n in z.files:
                if n in P:
                    put(P[n], shard_index(cfg, n, P[n].shape, topo.tp, t_), z[n])
        sp = os.path.join(d, "trainer_state.json")
        if not os.path.isfile(sp):
            log.fatal(f"Check failed: ifs.is_open() Failed to open trainer state file: {sp}", "checkpoint.cc:203")
        if state is None:
            with open(sp) as f:
                state = f.read()
    for key, want in (("n_layer", cfg.n_layer), ("n_embd", cfg.n_embd), ("ddp_size", topo.dp),
                      ("tp_size", topo.tp), ("pp_size", topo.pp)):
        got = int(_field(state, key))
        if got != want:
            log.fatal(f"Check failed: {key} mismatch: checkpoint has {got}, but current run has {want}",
                      "checkpoint_manager.cc:56")
    step = int(_field(state, "global_step"))
    log.error(f"[CKPT] Load done: global_step={step}, consumed_batches ={int(_field(state, 'consumed_batches'))}, "
              f"last_lr={_field(state, 'last_lr')}, topology(ddp,tp,sp,pp)=({topo.dp},{topo.tp},"
              f"{int(_field(state, 'sp_size'))},{topo.pp})", "checkpoint.cc:106")
    log.info(f"Resume training from step {step}", "checkpoint_manager.cc:67")
    return step


if __name__ == "__main__":
    main(sys.argv[1:])
