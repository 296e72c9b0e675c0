"""The stand-in trainer: ``python -m tests.infinitrain_standin.trainer {gpt2|llama3} FLAGS...``
(what the build folder's ``gpt2`` / ``llama3`` scripts exec). See the package docstring."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time

import numpy as np

from . import gflags
from .gflags import Flag
from .glog import Logger
from .model import Config, Model, Numerics, F32, layer_linears, lora_init, param_names, put, \
    shard_index, take

# glog source positions, as in InfiniTrain's example/<model>/main.cc at b24d92f
STEP_LINE = {"gpt2": "main.cc:493", "llama3": "main.cc:470"}
MAIN = "main.cc:200"
CKPT = "checkpoint.cc:84"

GPT2_MODELS = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "d12", "d24", "d36", "d48"}
LLAMA3_MODELS = {"llama3"}


def flag_set(family: str) -> dict[str, Flag]:
    g = family == "gpt2"
    F = Flag
    fl = [
        F("input_bin", "string", ""), F("input_val_bin", "string", ""), F("tokenizer_bin", "string", ""),
        F("llmc_filepath", "string", ""),
        F("model", "string", "gpt2" if g else "llama3",
          (lambda v: v in GPT2_MODELS) if g else (lambda v: v in LLAMA3_MODELS)),
        F("batch_size", "uint32", 4), F("sequence_length", "uint32", 64),
        F("total_batch_size", "uint32", 256), F("num_iteration", "uint32", 10),
        F("freq_generate_txt", "uint32", 10), F("text_length", "uint32", 64),
        F("learning_rate", "double", 1e-4 if g else 1e-5),
        F("zero_stage", "int32", 0, lambda v: 0 <= v <= 3),
        F("val_loss_every", "uint32", 0), F("sample_every", "uint32", 0),
        F("overfit_single_batch", "bool", True),
        F("device", "string", "cuda", lambda v: v in ("cpu", "cuda")),
        F("nthread_per_process", "int32", 1), F("tensor_parallel", "uint32", 1),
        F("sequence_parallel", "bool", False), F("pipeline_parallel", "uint32", 1),
        F("virtual_pipeline_parallel", "uint32", 1),
        F("dtype", "string", "float32"),
        F("save_interval", "uint32", 0), F("load", "string", ""), F("save", "string", ""),
        F("max_checkpoint_keep", "uint32", 3), F("save_optimizer_state", "bool", True),
        F("precision_check", "string", ""),
        F("lora_rank", "int32", 0), F("lora_alpha", "double", 16.0),
        F("lora_target_modules", "string", "c_attn,c_proj" if g else "c_attn,c_proj,c_fc,c_fc2"),
        F("lora_save_path", "string", ""), F("lora_load_path", "string", ""),
        # PR #209
        F("pipeline_layer_partition", "string", ""), F("pipeline_layer_costs", "string", ""),
        F("pipeline_chunk_layout", "string", ""), F("pipeline_model_parallel_layout", "string", ""),
    ]
    if g:
        fl.append(F("dump_gradients", "string", ""))
    return gflags.with_glog_flags({f.name: f for f in fl})


# ---------------------------------------------------------------------------------------------
# files

def read_checkpoint(path: str, family: str, log: Logger) -> tuple[Config, dict[str, np.ndarray]]:
    if not path or not os.path.isfile(path):
        log.fatal(f"File not found: {path}", "checkpoint_loader.cc:62")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 1024:
        log.fatal(f"Check failed: header read from {path} (file too small: {raw.size} bytes)",
                  "checkpoint_loader.cc:66")
    hi = raw[:1024].view(np.int32)
    hf = raw[:1024].view(np.float32)
    data = raw[1024:]
    if data.size % 4:
        log.fatal(f"Check failed: file size of {path} is not a whole number of float32",
                  "checkpoint_loader.cc:66")
    data = data.view(np.float32)
    magic, version = int(hi[0]), int(hi[1])
    if family == "gpt2":
        log.check_eq(magic, 20240326, "magic == kHeaderMagic", f"({path})", "checkpoint_loader.cc:69")
        log.check_eq(version, 3, "version == kHeaderFP32Version", f"({path})", "checkpoint_loader.cc:71")
        T, V, L, H, C, Vp = (int(v) for v in hi[2:8])
        cfg = Config("gpt2", T, V, L, H, C, Vp)
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
    else:
        log.check_eq(magic, 20240803, "magic == kLLaMA3Magic", f"({path})", "checkpoint_loader.cc:52")
        log.check_eq(version, 3, "version == kLLaMA3FP32Version", f"({path})", "checkpoint_loader.cc:54")
        T, V, L, H, KV, C = (int(v) for v in hi[2:8])
        mult, multiple_of = float(hf[8]), int(hi[9])
        hidden = int(2 * (4 * C) / 3)
        if mult > 0:
            hidden = int(round(mult * hidden))
        ffn = (hidden + multiple_of - 1) // multiple_of * multiple_of
        cfg = Config("llama3", T, V, L, H, C, V, n_kv_head=KV, ffn=ffn)
        kvd = cfg.kv_dim
        shapes = [("transformer.wte.weight", (V, C)), ("ln_1.weight", (L, C)),
                  ("attn.c_attn.weight", (L, C + 2 * kvd, C)), ("attn.c_proj.weight", (L, C, C)),
                  ("ln_2.weight", (L, C)), ("mlp.c_fc.weight", (L, ffn, C)),
                  ("mlp.c_fc2.weight", (L, ffn, C)), ("mlp.c_proj.weight", (L, C, ffn)),
                  ("transformer.ln_f.weight", (C,)), ("lm_head.weight", (V, C))]
        log.info(f"  vocab_size         = {V}\n  n_layer            = {L}\n  n_kv_head          = {KV}",
                 "checkpoint_loader.cc:110")
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
    def __init__(self, world, tp, pp, vpp):
        self.world, self.tp, self.pp, self.vpp = world, tp, pp, vpp
        self.dp = world // (tp * pp)

    def coords(self, g):
        return g % self.tp, (g // self.tp) % self.dp, g // (self.tp * self.dp)  # tp, dp, pp


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


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("gpt2", "llama3"):
        sys.stderr.write("usage: python -m tests.infinitrain_standin.trainer {gpt2|llama3} FLAGS...\n")
        sys.exit(2)
    family = argv[0]
    fl, _rest = gflags.parse_or_exit(argv[1:], flag_set(family))
    log = Logger(family, fl)
    t_start = time.perf_counter()

    proc_world = int(os.environ.get("PROC_WORLD_SIZE", "1") or 1)
    proc_rank = int(os.environ.get("GLOBAL_PROC_RANK", "0") or 0)
    nthread = fl["nthread_per_process"]
    world = proc_world * nthread
    tp, pp, vpp = fl["tensor_parallel"], fl["pipeline_parallel"], fl["virtual_pipeline_parallel"]
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        log.info(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")
    log.check(tp >= 1 and pp >= 1 and vpp >= 1 and nthread >= 1, "tp >= 1 && pp >= 1 && vpp >= 1 && nthread >= 1",
              "", "global.cc:100")
    log.check_eq(world % (tp * pp), 0, "world_size % (tensor_parallel_size * pipeline_parallel_size) == 0",
                 "", "global.cc:100")
    topo = Topo(world, tp, pp, vpp)
    my_ranks = [proc_rank * nthread + t for t in range(nthread)]
    last_rank = world - 1
    log.info(f"world_size={world} DP={topo.dp} TP={tp} PP={pp} VPP={vpp} ranks={my_ranks}", "global.cc:110")

    if last_rank in my_ranks:
        if fl["save"] and fl["save_interval"] == 0:
            log.fatal(f"Invalid configuration: --save is set ('{fl['save']}'), but --save_interval is 0. "
                      "They must be set together.", "main.cc:131")
        if not fl["save"] and fl["save_interval"] > 0:
            log.fatal(f"Invalid configuration: --save_interval is set to {fl['save_interval']}, but --save is "
                      "empty. They must be set together.", "main.cc:137")

    # NCCL unique-id files of the process groups whose first rank this process holds
    ccl_files: list[str] = []
    if world > 1:
        groups = []
        for g in my_ranks:
            t_, d_, p_ = topo.coords(g)
            if topo.dp > 1 and d_ == 0:
                groups.append(f"DP{p_ * tp + t_}")
            if tp > 1 and t_ == 0:
                groups.append(f"TP{p_ * topo.dp + d_}")
            if pp > 1 and p_ == 0:
                groups.append(f"PP{d_ * tp + t_}")
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
    tp, pp, dp, world = topo.tp, topo.pp, topo.dp, topo.world
    B, T = fl["batch_size"], fl["sequence_length"]
    if fl["sequence_parallel"]:
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

    cfg, P = read_checkpoint(fl["llmc_filepath"], family, log)
    if family == "gpt2":
        log.check(T <= cfg.block_size, "sequence_length <= block_size", f"({T} vs. {cfg.block_size})")
    if tp > 1:
        log.check_eq(cfg.n_embd % tp, 0, "n_embd % tp_size == 0", "n_embd must be divisible by TP world size.",
                     "checkpoint_loader.cc:98")
        log.check_eq(cfg.n_head % tp, 0, "n_head % tp_size == 0", "n_head must be divisible by TP world size.",
                     "checkpoint_loader.cc:100")
        vrows = P["transformer.wte.weight"].shape[0]
        log.check_eq(vrows % tp, 0, "config.vocab_size % tp_world_size == 0",
                     "Vocab size should be divisible by TP world size", "transformer.cc:208")
        if family == "llama3":
            log.check_eq(cfg.n_kv_head % tp, 0, "n_kv_head % tp_size == 0", "", "checkpoint_loader.cc:104")
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
                   lora_modules=lora_mods, frozen_base=bool(lora_mods))
    model = Model(cfg, P, num)
    names = [n for n in P if (n.endswith(("lora_A", "lora_B")) if lora_mods else True)]
    log.info(f"Optimizing {len(names)} {'LoRA' if lora_mods else 'model'} parameters", "main.cc:264")

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
    crash_rank = os.environ.get("STANDIN_CRASH_RANK", "")
    crash_rank = int(crash_rank) if crash_rank.strip() else None
    crash_step = int(os.environ.get("STANDIN_CRASH_STEP", "1") or 1)
    no_step_lines = os.environ.get("STANDIN_NO_STEP_LINES", "") not in ("", "0")
    sleep_s = float(os.environ.get("STANDIN_SLEEP", "0") or 0)
    if sleep_s > 0:
        time.sleep(sleep_s)

    for g in my_ranks:
        log.info(f"Rank {g}: start training", "main.cc:352")
    nmb = ga  # microbatches per DP rank per step
    lr = F32(fl["learning_rate"])
    ga_ref = ga * dp
    dumped = False
    nparams = sum(a.size for a in P.values())
    used_mb = max(1, int(math.ceil(nparams * 4 * 3 / 2**20)))
    reserved_mb = used_mb + 2

    for step in range(start_step, fl["num_iteration"]):
        t0 = time.perf_counter()
        if crash_rank is not None and crash_rank in my_ranks and step + 1 == crash_step:
            log.fatal(f"Check failed: planted crash on rank {crash_rank}", "main.cc:420")
        # gradients, grouped as the topology groups them
        rank_grads, rank_losses = [], []
        for d in range(dp):
            if pp == 1:
                js = [d + dp * k for k in range(nmb)]
            else:
                js = [d * nmb + k for k in range(nmb)]
            per = []
            lossf = F32(0)
            for j in js:
                x, y = unit_batch(step * ga_ref + j)
                loss, g = model.forward_backward(x, y, pos, 1.0 / nmb)
                lossf = F32(lossf + F32(loss / F32(nmb)))
                per.append(g)
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
        if dp > 1:  # all-reduce average: a reduction tree over the DP ranks, then / dp
            while len(rank_grads) > 1:
                nxt = [_add(rank_grads[i], rank_grads[i + 1]) for i in range(0, len(rank_grads) - 1, 2)]
                if len(rank_grads) % 2:
                    nxt.append(rank_grads[-1])
                rank_grads = nxt
            grads = rank_grads[0]
            grads = {k: (v / F32(dp)).astype(F32) for k, v in grads.items()}
            lossf = F32(0)
            for l_ in rank_losses:
                lossf = F32(lossf + l_)
            lossf = F32(lossf / F32(dp))
        else:
            grads, lossf = rank_grads[0], rank_losses[0]
        if plant_name is not None and plant_name in grads:
            grads[plant_name] = (grads[plant_name] * F32(1.0 + plant_scale)).astype(F32)
        for k, gv in grads.items():  # SGD
            P[k] -= lr * gv
        if fl.get("dump_gradients") and not dumped:
            _dump(fl["dump_gradients"], grads, cfg, topo, my_ranks, stages)
            dumped = True
        dur = time.perf_counter() - t0
        if last_rank in my_ranks and not no_step_lines:
            sp = tp if fl["sequence_parallel"] else 1
            log.error(f"step {step + 1:4d}/{fl['num_iteration']} | train loss {float(lossf):.6f} | "
                      f"lr {fl['learning_rate']:.2e} | ({dur * 1e3:.2f} ms | "
                      f"{fl['total_batch_size'] / max(dur, 1e-9):.0f} tok/s | peak used: {used_mb:5d} MB | "
                      f"peak reserved: {reserved_mb:5d} MB, DP={dp}, TP={tp}, SP={sp}, PP={pp})",
                      STEP_LINE[family])
        if fl["save"] and fl["save_interval"] > 0:
            if (step + 1) % fl["save_interval"] == 0 or step + 1 == fl["num_iteration"]:
                consumed = ((dp - 1) + dp * (step + 1) * (nmb if pp == 1 else 1))
                _save_checkpoint(fl, log, cfg, P, topo, my_ranks, last_rank, stages, step + 1, consumed)
    if fl["lora_save_path"] and lora_mods and last_rank in my_ranks:
        np.savez(fl["lora_save_path"], **{k: v for k, v in P.items() if k.endswith(("lora_A", "lora_B"))})
    log.info(f"done in {time.perf_counter() - t_start:.3f} s", "main.cc:540")


def _add(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out else v
    return out


def _held(name, cfg, topo: Topo, g, stages):
    t_, d_, p_ = topo.coords(g)
    return param_stage(name, stages, topo.pp) == p_


def _dump(dirname, grads, cfg, topo: Topo, my_ranks, stages):
    os.makedirs(dirname, exist_ok=True)
    for name in sorted(grads):
        holders = [g for g in range(topo.world) if _held(name, cfg, topo, g, stages)]
        writer = max(holders)  # the last writer: highest global rank (highest TP / DP index)
        if writer not in my_ranks:
            continue
        t_ = topo.coords(writer)[0]
        g = grads[name]
        idx = shard_index(cfg, name, g.shape, topo.tp, t_)
        save_npy(os.path.join(dirname, name + ".npy"), take(g, idx))


def _rank_dir(root, step, topo, g):
    d = os.path.join(root, f"checkpoint_step_{step:06d}")
    if topo.world > 1:
        d = os.path.join(d, f"rank_{g:06d}")
    return d


def _save_checkpoint(fl, log, cfg, P, topo: Topo, my_ranks, last_rank, stages, step, consumed):
    t0 = time.perf_counter()
    for g in my_ranks:
        d = _rank_dir(fl["save"], step, topo, g)
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
                    f"  \"last_lr\": {fl['learning_rate']:g},\n  \"ddp_size\": {topo.dp},\n"
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
        log.info(f"Checkpoint saved at: {_rank_dir(root, step, topo, last_rank)} "
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
