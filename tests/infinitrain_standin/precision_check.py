"""The stand-in's ``--precision_check``: InfiniTrain master's (b24d92f) module-level precision
checker, for gpt2 and llama3, written as the real binary writes it.

- Parsing: ``PrecisionCheckConfig::Parse`` (infini_train/src/utils/precision_check_config.cc:18-52):
  comma-separated ``key=value`` items (an item without ``=`` is ignored, a later key wins),
  ``level`` through ``std::stoi`` and ``md5_tolerance`` through ``std::stod``: a value they cannot
  read throws, nothing catches it, and the program dies as libstdc++'s terminate handler makes it
  (``terminate called after throwing an instance of 'std::invalid_argument'`` / ``what():  stoi``,
  SIGABRT) before anything else is printed. ``path`` (default ``./log_precision_check``),
  ``format`` (``md5`` or anything else: simple), ``save_tensors`` (``true`` or ``1``). level 0:
  off; any other level hooks every module (precision_checker.cc:381-400); level 2's
  autograd-function entries (function.cc:142) are NOT emulated.
- Output (precision_check_config.cc:58-76, precision_checker.cc:186-272, :280-372): one
  ``<path>/<YYYYMMDD_HHMMSS>`` folder per process (local time at start-up), printed as
  ``[PrecisionCheck] Output: <folder>``; per global rank ``precision_check_rank_<R>.log`` (its
  first line also prints ``[Rank R] Precision check output: <file>``) and, with save_tensors,
  ``rank_<R>/<name>[_<idx>]_<forward|backward>.npy`` (float32). idx counts the (name, phase)
  entries already written in this iteration (reset every iteration: files of the last iteration
  remain; with gradient accumulation the k-th microbatch's are ``_k``).
- Names and order: module_order() below, the order the real binary's hooks fire in (copied from
  master's CPU gpt2 / llama3 runs: tests/infinitrain_standin/precision_check_{gpt2,llama3}_order.txt).
  Forward: each module's output; backward: the gradient w.r.t. its output (a full backward hook's
  grad_outputs). Values: the stand-in model's own (model.Model.forward_backward(trace=...)).
- Multi-rank (threads of one process in InfiniTrain): each global rank this process plays writes
  its own log and rank folder. TP: column-parallel outputs (attn.c_attn, mlp.c_fc, mlp.c_fc2,
  mlp.gelu / mlp.silu, lm_head and the containers after it) are the rank's slice (c_attn:
  [q_r | k_r | v_r]; lm_head: its shard of the padded vocabulary), the loss module is
  ``VocabParallelCrossEntropyLoss`` (main.cc:334-337, not in the name map: its type). DP: each
  rank its own microbatches. PP (vpp 1): the rank's stage only, its layers named by their local
  index (transformer.cc:222-236), the stage's modules in the single-device order, a stage's
  microbatches' forwards then their backwards (GPipe, pipeline_schedule.cc:71-111); the
  ``Sequential`` chunk wrapper and the exact hook order of a PP stage are NOT emulated (no real
  multi-rank output was available to copy). Sequence parallel and context parallel: not emulated.
  Note: master's name map (precision_checker.cc:25, :409-427) is one global map that every rank's
  thread clears and refills; the real multi-thread binary may name other ranks' modules by type.
  The stand-in names every rank's modules by their qualified names.

STANDIN_PLANT_MODULE=<module qualified name>:<scale> (model.Numerics.plant_module) multiplies
that module's forward output by scale in every run, one device too (plantable: PLANTABLE).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import sys
import time

import numpy as np

F32 = np.float32

# the modules STANDIN_PLANT_MODULE may name (per block: transformer.h.<i>.<suffix>)
BLOCK_MODULES = {"gpt2": ("ln_1", "attn.c_attn", "attn.c_proj", "attn", "ln_2", "mlp.c_fc", "mlp.gelu",
                          "mlp.c_proj", "mlp", ""),
                 "llama3": ("ln_1", "attn.c_attn", "attn.c_proj", "attn", "ln_2", "mlp.c_fc", "mlp.c_fc2",
                            "mlp.silu", "mlp.c_proj", "mlp", "")}
PLANTABLE = "transformer.wte, transformer.wpe (gpt2), TransformerFirstStage, transformer.h.<i>[.<module>], " \
            "transformer.ln_f"


class Config:
    def __init__(self):
        self.level = 0
        self.output_path = "./log_precision_check"
        self.format = "simple"
        self.save_tensors = False
        self.md5_tolerance = 0.0


def _terminate(what: str, kind: str = "std::invalid_argument") -> None:
    sys.stdout.flush()
    sys.stderr.write(f"terminate called after throwing an instance of '{kind}'\n  what():  {what}\n")
    sys.stderr.flush()
    from .glog import die_by_signal
    die_by_signal(signal.SIGABRT)


def _stoi(text: str) -> int:
    """std::stoi: strtol's leading white space, sign and digits; none: invalid_argument; outside
    int: out_of_range."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?\d+)", text)
    if not m:
        _terminate("stoi")
    v = int(m.group(1))
    if not -2**31 <= v < 2**31:
        _terminate("stoi", "std::out_of_range")
    return v


def _stod(text: str) -> float:
    """std::stod: strtod's prefix (decimal, hexadecimal, inf / infinity, nan); none:
    invalid_argument; overflow or underflow (ERANGE): out_of_range."""
    t = text.lstrip(" \t\n\v\f\r")
    m = re.match(r"[+-]?(inf(inity)?|nan(\([0-9A-Za-z_]*\))?)", t, re.I)
    if m:
        return float(m.group(0).split("(")[0])
    m = re.match(r"[+-]?0x([0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(p[+-]?\d+)?", t, re.I)
    if m:
        s = m.group(0)
        v = float.fromhex(s if "p" in s.lower() else s + "p0")
    else:
        m = re.match(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", t, re.I)
        if not m:
            _terminate("stod")
        v = float(m.group(0))
        mant = re.sub(r"e.*", "", m.group(0), flags=re.I)
        if v == 0 and re.search(r"[1-9]", mant):
            _terminate("stod", "std::out_of_range")
    if math.isinf(v) or (v != 0 and abs(v) < 2.2250738585072014e-308):
        _terminate("stod", "std::out_of_range")
    return v


def parse(text: str) -> Config:
    """PrecisionCheckConfig::Parse (precision_check_config.cc:18-52), its exceptions included."""
    c = Config()
    if not text:
        return c
    kv: dict[str, str] = {}
    for item in text.split(","):
        pos = item.find("=")
        if pos >= 0:
            kv[item[:pos]] = item[pos + 1:]
    if "level" in kv:
        c.level = _stoi(kv["level"])
    if "path" in kv:
        c.output_path = kv["path"]
    if "format" in kv:
        c.format = kv["format"]
    if "save_tensors" in kv:
        c.save_tensors = kv["save_tensors"] in ("true", "1")
    if "md5_tolerance" in kv:
        c.md5_tolerance = _stod(kv["md5_tolerance"])
    return c


def plant_module(family: str, n_layer: int) -> tuple[str, float] | None:
    """STANDIN_PLANT_MODULE=<name>:<scale>, checked against the model's modules (exit 2)."""
    text = os.environ.get("STANDIN_PLANT_MODULE", "").strip()
    if not text:
        return None
    name, _, sc = text.rpartition(":")
    names = {"transformer.wte", "TransformerFirstStage", "transformer.ln_f"}
    if family == "gpt2":
        names.add("transformer.wpe")
    for i in range(n_layer):
        for suf in BLOCK_MODULES[family]:
            names.add(f"transformer.h.{i}" + (f".{suf}" if suf else ""))
    try:
        scale = float(sc)
    except ValueError:
        scale = None
    if name not in names or scale is None:
        sys.stderr.write(f"STANDIN_PLANT_MODULE must be <module>:<scale> with module one of {PLANTABLE} "
                         f"(got {text!r})\n")
        sys.exit(2)
    return name, scale


# ---------------------------------------------------------------------------------------------
# names and order

def module_order(family: str, layers: list[int], first: bool = True, last: bool = True,
                 whole: bool = True, loss_name: str = "CrossEntropyLoss") -> tuple[list, list]:
    """(forward, backward): lists of (logged name, value key) in the order the real binary's
    hooks fire. ``layers``: the global indices of the blocks this rank runs, in order (named by
    their position in it). ``first`` / ``last``: the stage holds the embeddings / the head;
    ``whole``: TransformerModel::Forward runs (no PP), so ``Transformer`` is logged.
    Facts from master's CPU runs (precision_check_gpt2_order.txt, precision_check_llama3_order.txt):
    the backward fires the last block's hook and then TransformerChunk's, then per block
    mlp.c_proj, mlp, [gelu, c_fc | c_fc, silu, c_fc2], ln_2, attn.c_proj, attn, c_attn, ln_1
    (and the next block down first), then gpt2: TransformerFirstStage, wte, wpe; llama3: wte,
    TransformerFirstStage."""
    g2 = family == "gpt2"
    fwd: list[tuple[str, str]] = []
    bwd: list[tuple[str, str]] = []

    def blk(k):
        return f"transformer.h.{k}"

    if first:
        fwd += [("transformer.wte", "transformer.wte")]
        if g2:
            fwd += [("transformer.wpe", "transformer.wpe")]
        fwd += [("TransformerFirstStage", "TransformerFirstStage")]
    mlp_f = ["mlp.c_fc", "mlp.gelu"] if g2 else ["mlp.c_fc", "mlp.c_fc2", "mlp.silu"]
    mlp_b = ["mlp.gelu", "mlp.c_fc"] if g2 else ["mlp.c_fc", "mlp.silu", "mlp.c_fc2"]
    for k, i in enumerate(layers):
        fwd += [(f"{blk(k)}.{s}", f"{blk(i)}.{s}") for s in
                ["ln_1", "attn.c_attn", "attn.c_proj", "attn", "ln_2"] + mlp_f + ["mlp.c_proj", "mlp"]]
        fwd += [(blk(k), blk(i))]
    last_h = blk(layers[-1]) if layers else "TransformerFirstStage"
    fwd += [("TransformerChunk", last_h)]
    if last:
        fwd += [("transformer.ln_f", "transformer.ln_f"), ("lm_head", "lm_head"),
                ("TransformerLastStage", "lm_head")]
        if whole:
            fwd += [("Transformer", "lm_head")]
        fwd += [(loss_name, "CrossEntropyLoss")]
        bwd += [(loss_name, "CrossEntropyLoss"), ("lm_head", "lm_head"), ("TransformerLastStage", "lm_head")]
        if whole:
            bwd += [("Transformer", "lm_head")]
        bwd += [("transformer.ln_f", "transformer.ln_f")]
    for j, (k, i) in enumerate(reversed(list(enumerate(layers)))):
        if j == 0:
            bwd += [(blk(k), blk(i)), ("TransformerChunk", blk(i))]
        else:
            bwd += [(blk(k), blk(i))]
        bwd += [(f"{blk(k)}.{s}", f"{blk(i)}.{s}") for s in
                ["mlp.c_proj", "mlp"] + mlp_b + ["ln_2", "attn.c_proj", "attn", "attn.c_attn", "ln_1"]]
    if not layers:
        bwd += [("TransformerChunk", "TransformerFirstStage")]
    if first:
        if g2:
            bwd += [("TransformerFirstStage", "TransformerFirstStage"), ("transformer.wte", "transformer.wte"),
                    ("transformer.wpe", "transformer.wpe")]
        else:
            bwd += [("transformer.wte", "transformer.wte"), ("TransformerFirstStage", "TransformerFirstStage")]
    return fwd, bwd


# column-parallel outputs (the rank's slice under TP): value key suffix -> kind
def _column_kind(key: str) -> str | None:
    if key.endswith("attn.c_attn"):
        return "qkv"
    if key.endswith(("mlp.c_fc", "mlp.c_fc2", "mlp.gelu", "mlp.silu")):
        return "split"
    if key == "lm_head":
        return "split"
    return None


def _tp_slice(a: np.ndarray, key: str, cfg, tp: int, r: int) -> np.ndarray:
    kind = _column_kind(key)
    if tp == 1 or kind is None:
        return a
    n = a.shape[-1]
    if kind == "qkv":
        C, kv = cfg.n_embd, cfg.kv_dim
        k1, k2 = C // tp, kv // tp
        idx = np.concatenate([np.arange(r * k1, (r + 1) * k1), C + np.arange(r * k2, (r + 1) * k2),
                              C + kv + np.arange(r * k2, (r + 1) * k2)])
    else:
        k = n // tp
        idx = np.arange(r * k, (r + 1) * k)
    return np.ascontiguousarray(a[..., idx])


# ---------------------------------------------------------------------------------------------
# output

def _num(v: float) -> str:
    """C++ ostream << float (default precision 6: %g); glibc prints a negative NaN as -nan."""
    v = float(v)
    if math.isnan(v):
        return "-nan" if math.copysign(1.0, v) < 0 else "nan"
    return f"{v:g}"


def log_line(name: str, idx: int, phase: str, a: np.ndarray, cfg: Config, i: int = 0,
             key: str = "[GAS-0] [L-0]") -> str:
    """One line of precision_check_rank_<R>.log (precision_checker.cc:323-371)."""
    log_name = name + (f"_{idx}" if idx > 0 else "") + "_" + phase
    flat = np.array(a, dtype=F32, order="C").reshape(-1)
    shape = "(" + ",".join(str(d) for d in np.shape(a)) + ")"
    head = f"{key} {log_name} tensor[{i}]: dtype=float32 shape={shape} "
    if cfg.format == "md5":
        if cfg.md5_tolerance > 0.0:
            inv = 1.0 / cfg.md5_tolerance
            data = (np.round(flat.astype(np.float64) * inv) * cfg.md5_tolerance).astype(F32)
        else:
            data = flat
        return head + "md5=" + hashlib.md5(data.tobytes()).hexdigest()
    nan = int(np.isnan(flat).sum())
    inf = int(np.isinf(flat).sum())
    if flat.size == 0:
        mn = mx = mean = 0.0
    else:
        ok = flat[np.isfinite(flat)]
        if ok.size:
            mn, mx = float(ok.min()), float(ok.max())
            mean = float(F32(ok.astype(np.float64).sum() / ok.size))
        else:
            mn, mx, mean = float(np.finfo(F32).max), float(-np.finfo(F32).max), 0.0
    vals = ", ".join(_num(v) for v in flat[:6]) + (", ..." if flat.size > 6 else "")
    err = " <- ERROR" if nan or inf else ""
    return head + f"min={_num(mn)} max={_num(mx)} mean={_num(mean)} [{vals}] [NaN:{nan} Inf:{inf}]{err}"


def save_npy(path: str, a: np.ndarray) -> None:
    """Tensor::SaveAsNpy's bytes (a 0-d tensor: shape ())."""
    a = np.array(a, dtype="<f4", order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    dims = ", ".join(str(d) for d in a.shape) + ("," if a.ndim == 1 else "")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + ") }"
    header += " " * (16 - ((10 + len(header) + 1) % 16)) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1"))
        f.write(a.tobytes())


class PrecisionCheck:
    """One process's checker: the timestamp folder, per-rank logs and counters."""

    def __init__(self, config: Config):
        self.config = config
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime())
        self.root = config.output_path + "/" + stamp
        os.makedirs(self.root, exist_ok=True)
        print(f"[PrecisionCheck] Output: {self.root}", flush=True)
        self._logs: dict[int, object] = {}
        self._counters: dict[int, dict[str, int]] = {}

    def reset_counters(self) -> None:
        """PrecisionChecker::ResetCounters, at the top of every iteration (main.cc:393)."""
        self._counters = {}

    def _log(self, rank: int):
        f = self._logs.get(rank)
        if f is None:
            path = f"{self.root}/precision_check_rank_{rank}.log"
            f = self._logs[rank] = open(path, "w")
            print(f"[Rank {rank}] Precision check output: {path}", flush=True)
        return f

    def write(self, rank: int, name: str, phase: str, a: np.ndarray) -> None:
        counters = self._counters.setdefault(rank, {})
        key = f"{name}_{phase}"
        idx = counters.get(key, 0)
        counters[key] = idx + 1
        a = np.asarray(a, dtype=F32)
        if self.config.save_tensors:
            d = f"{self.root}/rank_{rank}"
            os.makedirs(d, exist_ok=True)
            save_npy(f"{d}/{name}" + (f"_{idx}" if idx > 0 else "") + f"_{phase}.npy", a)
        f = self._log(rank)
        f.write(log_line(name, idx, phase, a, self.config) + "\n")
        f.flush()

    def entries(self, trace: dict, cfg, B: int, T: int, tp: int, tp_rank: int, layers: list[int],
                first: bool, last: bool, whole: bool) -> tuple[list, list]:
        """A microbatch's (forward, backward) entries for one rank: (name, array) in order."""
        loss_name = "VocabParallelCrossEntropyLoss" if tp > 1 else "CrossEntropyLoss"
        fo, bo = module_order(cfg.family, layers, first, last, whole, loss_name)

        def shaped(key, a):
            if key == "CrossEntropyLoss":
                return np.asarray(a, dtype=F32).reshape(())
            if key == "transformer.wpe":
                return a
            a = a.reshape(B, T, -1)
            return _tp_slice(a, key, cfg, tp, tp_rank)

        fwd = [(n, shaped(k, trace["forward"][k])) for n, k in fo]
        bwd = [(n, shaped(k, trace["backward"][k])) for n, k in bo]
        return fwd, bwd

    def close(self) -> None:
        for f in self._logs.values():
            f.close()
