"""The stand-in ``tiny_mixtral``: ``python -m tests.infinitrain_standin.tiny_mixtral FLAGS...`` (what a
support_moe build folder's ``tiny_mixtral`` script execs). It plays InfiniTrain feat/support_moe
(b7e0760) ``example/tiny_mixtral/main.cc`` from outside:

- gflags-strict with exactly that program's flags (feat/support_moe:example/tiny_mixtral/main.cc:24-35):
  no ``nthread_per_process`` / ``tensor_parallel`` / ..., so those are ``ERROR: unknown command line
  flag`` (exit 1). Single device only: the binary calls InitAllEnv(1, 1, false, 1, 1)
  (feat/support_moe:example/tiny_mixtral/main.cc:61-66) and never builds a process group.
- its checks, in its order and words: the loader's open / header / magic / version CHECKs
  (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:42-46), SanitizeTinyMixtralConfig on
  the header's config (feat/support_moe:example/tiny_mixtral/config.h:43-74), the header-vs-runtime
  comparisons (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:34, :77-96), then
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

What it trains is the stand-in's own SMALL model, not Mixtral: a token-embedding (input ids
hashed into 256 buckets) + one residual top-2-of-4-experts MoE layer (softmax over the two
selected router logits, SiLU experts) + an output head over 256 buckets of the 128256-token
vocabulary (each bucket's 501 tokens share a logit, so the loss starts near ln 128256 = 11.76),
in float32 numpy, deterministic: two runs of the same flags and files print the same losses bit
for bit. Its weights are seeded from the checkpoint file's bytes (the first MiB and the size),
or from a fixed seed when --llmc_filepath is empty (the real binary then initialises a fresh
model, main.cc:73-75).

The checkpoint: the real file (a 3.4 GB Megatron export) is a 256-int32 header (magic 20260513,
version 2, the config in slots 2-16) followed by the float32 weights. The stand-in checks the
header as the real loader does and does NOT read the weights: ``write_checkpoint(path)`` writes a
small file with the real header and a short seed payload (the real binary would refuse that file
with ``Failed to read tensor transformer.wte.weight``; the stand-in accepts it). A file with
another magic or version aborts with glog's F line (CHECK_EQ), SIGABRT.

bfloat16 rounds the MoE layer's output and the head's input to bf16 (the numbers move a little).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

from . import gflags
from .gflags import Flag
from .glog import Logger
from .model import F32, to_bf16

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


def write_checkpoint(path, seed: int = 0, **overrides) -> str:
    """Write a stand-in tiny Mixtral checkpoint: the real header (magic 20260513, version 2, the
    config TinyMixtralConfig() expects, so the header comparisons pass) and a 64-byte seed payload
    instead of the 3.4 GB weights (see the module docstring). ``overrides`` (e.g. ``magic=1``)
    make a file the loader refuses."""
    payload = np.random.default_rng(seed).integers(0, 2**31 - 1, 16, dtype=np.int64).astype(np.int32)
    with open(path, "wb") as f:
        f.write(header_ints(**overrides).tobytes())
        f.write(payload.tobytes())
    return str(path)


def _fmt(v) -> str:
    """A value as std::ostream prints it (floats %g, bools 0/1)."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def load_header(path: str, log: Logger) -> bytes:
    """CheckLLMCConfig (feat/support_moe:example/tiny_mixtral/checkpoint_loader.cc:74-97): read the
    header, check magic / version, sanitize and compare with the runtime config. Returns the
    bytes the stand-in seeds its weights from."""
    if not os.path.isfile(path):  # CHECK(ifs), checkpoint_loader.cc:42
        log.fatal(f"Check failed: ifs Failed to open tiny Mixtral LLMC file: {path}", f"{LOADER}:42")
    with open(path, "rb") as f:
        head = f.read(HEADER_INTS * 4)
        rest = f.read(1 << 20)
    size = os.path.getsize(path)
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
    for key in ("block_size", "vocab_size", "original_vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd",
                "ffn_expansion_ratio", "norm_eps", "rope_theta", "use_scaled_rope", "num_experts",
                "router_topk", "moe_ffn_hidden_size"):  # checkpoint_loader.cc:77-96
        want = RUNTIME_CONFIG[key]
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
    return head + size.to_bytes(8, "little") + rest


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


# ---------------------------------------------------------------------------------------------
# the stand-in's model: embedding buckets -> residual top-2-of-4 MoE -> bucketed vocabulary head

VOCAB = 128256
BUCKETS = 256  # 128256 = 256 x 501
D, FF, EXPERTS, TOPK = 16, 32, 4, 2


def init_params(seed_bytes: bytes) -> dict[str, np.ndarray]:
    seed = int.from_bytes(hashlib.sha256(seed_bytes).digest()[:8], "little")
    rng = np.random.default_rng(seed)

    def n(*shape, std):
        return (rng.standard_normal(shape) * std).astype(F32)
    return {"wte": n(BUCKETS, D, std=0.5), "router": n(D, EXPERTS, std=0.5),
            "w1": n(EXPERTS, D, FF, std=0.25), "w2": n(EXPERTS, FF, D, std=0.25), "head": n(D, BUCKETS, std=0.1)}


def forward_backward(P: dict, x: np.ndarray, y: np.ndarray, scale: float, bf16: bool = False):
    """Mean cross-entropy over the tokens of (x, y) and its gradients, each multiplied by
    ``scale`` (the 1/grad_accum_steps of main.cc:129)."""
    xi = (x % BUCKETS).astype(np.int64)
    yb = (y % BUCKETS).astype(np.int64)
    N = xi.size
    h0 = P["wte"][xi]  # (N, D)
    r = h0 @ P["router"]  # (N, E)
    top = np.argsort(-r, axis=1, kind="stable")[:, :TOPK]  # (N, K)
    rs = np.take_along_axis(r, top, axis=1)
    rs = rs - rs.max(axis=1, keepdims=True)
    g = np.exp(rs)
    g = (g / g.sum(axis=1, keepdims=True)).astype(F32)  # (N, K)
    G = np.zeros((N, EXPERTS), F32)
    np.put_along_axis(G, top, g, axis=1)
    a = np.einsum("nd,edf->enf", h0, P["w1"])  # (E, N, FF)
    sig = (1.0 / (1.0 + np.exp(-a))).astype(F32)
    z = a * sig
    o = np.einsum("enf,efd->end", z, P["w2"])  # (E, N, D)
    h = h0 + np.einsum("ne,end->nd", G, o)
    if bf16:
        h = to_bf16(h)
    s = h @ P["head"]  # (N, B)
    m = s.max(axis=1, keepdims=True)
    ex = np.exp(s - m)
    se = ex.sum(axis=1, keepdims=True)
    per = VOCAB // BUCKETS
    lse = (m + np.log(se) + np.log(F32(per)))[:, 0]
    loss = F32(np.mean(lse - s[np.arange(N), yb], dtype=F32))
    # backward
    ds = ex / se  # softmax over buckets (each bucket's tokens share it equally)
    ds[np.arange(N), yb] -= 1.0
    ds *= F32(scale / N)
    grads = {"head": h.T @ ds}
    dh = ds @ P["head"].T
    dh0 = dh.copy()
    dG = np.einsum("nd,end->ne", dh, o)
    do = G.T[:, :, None] * dh[None]  # (E, N, D)
    grads["w2"] = np.einsum("enf,end->efd", z, do)
    dz = np.einsum("end,efd->enf", do, P["w2"])
    da = dz * (sig * (1.0 + a * (1.0 - sig)))
    grads["w1"] = np.einsum("nd,enf->edf", h0, da)
    dh0 += np.einsum("enf,edf->nd", da, P["w1"])
    dg = np.take_along_axis(dG, top, axis=1)
    drs = g * (dg - (g * dg).sum(axis=1, keepdims=True))
    dr = np.zeros((N, EXPERTS), F32)
    np.put_along_axis(dr, top, drs.astype(F32), axis=1)
    grads["router"] = h0.T @ dr
    dh0 += dr @ P["router"].T
    dw = np.zeros_like(P["wte"])
    np.add.at(dw, xi, dh0)
    grads["wte"] = dw
    return loss, {k: v.astype(F32) for k, v in grads.items()}


class Adam:
    """feat/support_moe:infini_train/src/kernels/cpu/accumulate_grad.cc:22-33, float32."""

    def __init__(self, P, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.P, self.lr = P, F32(lr)
        self.b1, self.b2, self.eps = F32(beta1), F32(beta2), F32(eps)
        self.m = {k: np.zeros_like(v) for k, v in P.items()}
        self.v = {k: np.zeros_like(v) for k, v in P.items()}
        self.t = 0

    def step(self, grads):
        self.t += 1
        bc_m = F32(1.0) - F32(self.b1 ** self.t)
        bc_v = F32(1.0) - F32(self.b2 ** self.t)
        one = F32(1.0)
        for k, p in self.P.items():
            gr = grads[k]
            self.m[k] = self.b1 * self.m[k] + (one - self.b1) * gr
            self.v[k] = self.b2 * self.v[k] + (one - self.b2) * gr * gr
            m_hat = self.m[k] / bc_m
            v_hat = self.v[k] / bc_v
            p -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def main(argv: list[str]) -> None:
    from .trainer import _build_opts, _die_no_cuda, read_tokens
    flavour, cuda, argv = _build_opts(argv)
    fl, _rest = gflags.parse_or_exit(argv, flag_set(), "tiny_mixtral")
    log = Logger("tiny_mixtral", fl)
    seed_bytes = b"tiny_mixtral: no checkpoint"
    if fl["llmc_filepath"]:  # main.cc:71-72
        seed_bytes = load_header(fl["llmc_filepath"], log)
    # ValidateRuntimeFlags, feat/support_moe:example/tiny_mixtral/main.cc:46-52
    log.check(fl["input_bin"] != "", "!FLAGS_input_bin.empty()", "tiny Mixtral training requires --input_bin",
              "main.cc:46")
    mb, gb, T = fl["micro_batch_size"], fl["global_batch_size"], fl["sequence_length"]
    log.check_op(mb > 0, "FLAGS_micro_batch_size > 0", mb, 0, "", "main.cc:47")
    log.check_op(gb > 0, "FLAGS_global_batch_size > 0", gb, 0, "", "main.cc:48")
    log.check_eq(gb % mb, 0, "FLAGS_global_batch_size % FLAGS_micro_batch_size == 0",
                 "global_batch_size must be divisible by micro_batch_size", "main.cc:49")
    log.check_op(T > 0, "FLAGS_sequence_length > 0", T, 0, "", "main.cc:51")
    block = RUNTIME_CONFIG["block_size"]
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

    P = init_params(seed_bytes)
    opt = Adam(P, fl["learning_rate"])
    ga = gb // mb  # main.cc:108
    tokens_per_step = float(gb) * T  # main.cc:109
    durations = []
    batch = 0
    n_iter = fl["num_iteration"]
    for step in range(n_iter):
        t0 = time.perf_counter()
        lossf = F32(0)
        acc = None
        for _ in range(ga):
            if batch == nbatches:  # main.cc:118-120: wrap to the loader's beginning
                batch = 0
            start = batch * mb * T
            chunk = toks[start:start + mb * T + 1]
            batch += 1
            loss, g = forward_backward(P, chunk[:-1], chunk[1:], 1.0 / ga, bf16)
            lossf = F32(lossf + F32(loss / F32(ga)))  # main.cc:128
            acc = g if acc is None else {k: acc[k] + g[k] for k in acc}
        opt.step(acc)  # main.cc:133
        dur_ms = (time.perf_counter() - t0) * 1e3
        durations.append(dur_ms)
        li = fl["log_interval"]
        if li > 0 and ((step + 1) % li == 0 or step + 1 == n_iter):  # main.cc:140-144
            sys.stdout.write(f"step {step + 1:4d}/{n_iter} | train loss {float(lossf):.6f} | norm -1.0000 | "
                             f"lr {fl['learning_rate']:.2e} | ({dur_ms:.2f} ms | "
                             f"{tokens_per_step / (dur_ms / 1e3):.0f} tok/s)\n")
            sys.stdout.flush()
    if durations:  # main.cc:147-155: the first step is left out of the average when there are more
        rest = durations[1:] if len(durations) > 1 else durations
        sys.stdout.write(f"final {len(rest)} iters avg: {sum(rest) / len(rest):.3f}ms\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
