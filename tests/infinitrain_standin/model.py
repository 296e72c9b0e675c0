"""The stand-in's model: InfiniTrain's parameter names and shapes, a toy but fully
differentiable per-token function of every parameter, hand-written numpy backprop, float32.

Per token (no attention, no real normalisation; ``lin(x, W) = x @ W.T (+ b)``)::

    h = wte[x] (+ wpe[t] for GPT-2)
    per layer i:
        a = h * ln_1.weight (+ ln_1.bias)
        z = tanh(lin(a, attn.c_attn));  s = z[:, :C] + mean(z[:, C:], -1)
        h = h + lin(s, attn.c_proj)
        m = h * ln_2.weight (+ ln_2.bias)
        GPT-2:   f = tanh(lin(m, mlp.c_fc))
        LLaMA 3: f = lin(m, mlp.c_fc) * tanh(lin(m, mlp.c_fc2))
        h = h + lin(f, mlp.c_proj)
    logits = lin(rmsnorm(h) * ln_f.weight (+ ln_f.bias), lm_head[:vocab_size]);  loss = mean CE
    (rmsnorm(h) = h / sqrt(mean(h^2) + 1e-5), so the head sees O(1) inputs and the loss moves)

Every parameter is initialised from the llm.c checkpoint's tensors (``lm_head.weight`` of GPT-2 is a
copy of wte, as InfiniTrain copies it; it is not tied afterwards). GPT-2's wte / lm_head are held
internally at padded_vocab_size rows; a rank sees ``vocab_size`` rows when TP=1 and a 1/TP row
shard of the padded matrix when TP>1 (as InfiniTrain's loader). The padded rows never receive
gradient.

Parallel rounding: with TP>1, row-parallel matmuls (attn.c_proj, mlp.c_proj) are computed as sums
of per-shard partial products in forward, and column-parallel ones (c_attn, c_fc, c_fc2, lm_head)
sum per-shard partial products for the input gradient. bfloat16: matmul operands and outputs (each
partial product) are rounded to bf16 (round-to-nearest-even on the float32 bits).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32
# The final norm's epsilon; STANDIN_NORM_EPS plants another (a kernel constant that every
# configuration, one device or many, shares: the self-check cannot see it, a baseline can).
NORM_EPS = F32(os.environ.get("STANDIN_NORM_EPS", "1e-5"))


def to_bf16(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=F32)
    bits = a.view(np.uint32)
    r = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(F32)


@dataclass
class Config:
    family: str
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    padded_vocab_size: int
    n_kv_head: int = 0
    ffn: int = 0

    @property
    def kv_dim(self) -> int:
        if self.family == "gpt2":
            return self.n_embd
        return self.n_kv_head * (self.n_embd // self.n_head)

    @property
    def qkv_rows(self) -> int:
        return self.n_embd + 2 * self.kv_dim

    @property
    def hidden(self) -> int:
        return 4 * self.n_embd if self.family == "gpt2" else self.ffn


# linear modules: suffix -> parallel kind ("col": rows split, "row": cols split)
def linear_kind(name: str) -> str:
    if name.endswith("attn.c_proj") or name.endswith("mlp.c_proj"):
        return "row"
    return "col"


def layer_linears(cfg: Config, i: int) -> list[str]:
    p = f"transformer.h.{i}."
    mods = [p + "attn.c_attn", p + "attn.c_proj", p + "mlp.c_fc"]
    if cfg.family == "llama3":
        mods.append(p + "mlp.c_fc2")
    mods.append(p + "mlp.c_proj")
    return mods


def param_names(cfg: Config) -> list[str]:
    """InfiniTrain's parameter names, model order."""
    g = cfg.family == "gpt2"
    names = ["transformer.wte.weight"] + (["transformer.wpe.weight"] if g else [])
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        if g:
            names += [p + s for s in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
        else:
            names += [p + s for s in (
                "ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
                "mlp.c_fc.weight", "mlp.c_fc2.weight", "mlp.c_proj.weight")]
    names += ["transformer.ln_f.weight"] + (["transformer.ln_f.bias"] if g else []) + ["lm_head.weight"]
    return names


# --------------------------------------------------------------------------------------------
# TP sharding: which slice of the internal (full) tensor a TP rank holds, under the full name.

def _split(n: int, tp: int, r: int) -> np.ndarray:
    k = n // tp
    return np.arange(r * k, (r + 1) * k)


def shard_index(cfg: Config, name: str, shape: tuple, tp: int, r: int):
    """(axis, indices) of the slice TP rank ``r`` holds, or None when it holds it all."""
    vocab_param = name in ("transformer.wte.weight", "lm_head.weight")
    if vocab_param:
        if tp == 1:
            if shape[0] != cfg.vocab_size:
                return 0, np.arange(cfg.vocab_size)
            return None
        return 0, _split(shape[0], tp, r)
    if tp == 1:
        return None
    parts = name.split(".")
    if parts[-1] in ("lora_A", "lora_B"):
        mod = ".".join(parts[:-1])
        kind = linear_kind(mod)
        if kind == "col" and parts[-1] == "lora_B":
            return 0, _col_rows(cfg, mod, shape[0], tp, r)
        if kind == "row" and parts[-1] == "lora_A":
            return 1, _split(shape[1], tp, r)
        return None
    mod, leaf = ".".join(parts[:-1]), parts[-1]
    if not (mod.endswith(("c_attn", "c_proj", "c_fc", "c_fc2"))):
        return None  # norms, wpe: replicated
    kind = linear_kind(mod)
    if kind == "col":
        return 0, _col_rows(cfg, mod, shape[0], tp, r)
    if leaf == "weight":
        return 1, _split(shape[1], tp, r)
    return None  # row-parallel bias: replicated


def _col_rows(cfg: Config, mod: str, n: int, tp: int, r: int) -> np.ndarray:
    if mod.endswith("attn.c_attn"):  # fused [q | k | v]: each rank holds its share of each
        C, kv = cfg.n_embd, cfg.kv_dim
        return np.concatenate([_split(C, tp, r), C + _split(kv, tp, r), C + kv + _split(kv, tp, r)])
    return _split(n, tp, r)


def take(a: np.ndarray, idx) -> np.ndarray:
    if idx is None:
        return a
    axis, ind = idx
    return np.ascontiguousarray(np.take(a, ind, axis=axis))


def put(a: np.ndarray, idx, value: np.ndarray) -> None:
    if idx is None:
        a[...] = value
    elif idx[0] == 0:
        a[idx[1]] = value
    else:
        a[:, idx[1]] = value


# --------------------------------------------------------------------------------------------

def lora_init(name: str, rank: int, in_features: int) -> np.ndarray:
    """Deterministic lora_A: uniform(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform, a=sqrt(5)),
    seeded by crc32 of the parameter name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    bound = 1.0 / np.sqrt(in_features)
    return rng.uniform(-bound, bound, size=(rank, in_features)).astype(F32)


@dataclass
class Numerics:
    tp: int = 1
    bf16: bool = False
    lora_scale: float = 0.0
    lora_modules: set = field(default_factory=set)
    frozen_base: bool = False
    # STANDIN_PLANT_MODULE: (module qualified name, scale): that module's forward output is
    # multiplied by scale (precision_check.plant_module); None plants nothing
    plant_module: tuple | None = None


class Model:
    def __init__(self, cfg: Config, params: dict[str, np.ndarray], num: Numerics):
        self.cfg, self.P, self.num = cfg, params, num
        self._head_forward: "_HeadForward | None" = None

    def apply_update(self, grads: dict[str, np.ndarray], lr) -> None:
        """The SGD step, P -= lr * grad for each parameter in grads: the one way the trainer
        changes P, so the head's forward, cached for a step's microbatches, is dropped here."""
        for k, g in grads.items():
            self.P[k] -= lr * g
        self._head_forward = None

    # ---- linear with TP partial sums, bf16 rounding, LoRA ----
    def _r(self, a):
        return to_bf16(a) if self.num.bf16 else a

    def _mm(self, x, W, kind):
        """x @ W.T; row-parallel under TP: sum of per-column-shard partial products."""
        tp = self.num.tp
        if kind == "row" and tp > 1:
            k = W.shape[1] // tp
            y = None
            for r in range(tp):
                # contiguous shards: numpy's matmul falls back to a slow loop on strided ones
                part = self._r(np.ascontiguousarray(x[:, r * k:(r + 1) * k])
                               @ np.ascontiguousarray(W[:, r * k:(r + 1) * k]).T)
                y = part if y is None else y + part
            return y
        return self._r(x @ W.T)

    def _lin(self, x, mod):
        P = self.P
        W = P[mod + ".weight"]
        kind = linear_kind(mod)
        xq, Wq = self._r(x), self._r(W)
        y = self._mm(xq, Wq, kind)
        b = P.get(mod + ".bias")
        if b is not None:
            y = y + b
        cache = {"x": xq, "W": Wq, "mod": mod, "kind": kind, "bias": b is not None}
        if mod in self.num.lora_modules:
            A, B = self._r(P[mod + ".lora_A"]), self._r(P[mod + ".lora_B"])
            hA = self._r(xq @ A.T)
            y = y + F32(self.num.lora_scale) * self._r(hA @ B.T)
            cache.update(A=A, B=B, hA=hA)
        return y, cache

    def _lin_bwd(self, dy, c, grads):
        mod, Wq, xq = c["mod"], c["W"], c["x"]
        tp = self.num.tp
        if c["kind"] == "col" and tp > 1:
            k = Wq.shape[0] // tp
            dx = None
            for r in range(tp):
                part = np.ascontiguousarray(dy[:, r * k:(r + 1) * k]) @ Wq[r * k:(r + 1) * k]
                dx = part if dx is None else dx + part
        else:
            dx = dy @ Wq
        if not self.num.frozen_base:
            gW = dy.T @ xq
            _acc(grads, mod + ".weight", gW)
            if c["bias"]:
                _acc(grads, mod + ".bias", dy.sum(0))
        if "A" in c:
            s = F32(self.num.lora_scale)
            _acc(grads, mod + ".lora_B", s * (dy.T @ c["hA"]))
            dhA = s * (dy @ c["B"])
            _acc(grads, mod + ".lora_A", dhA.T @ xq)
            dx = dx + dhA @ c["A"]
        return dx

    # ---- lm head + cross-entropy, in row blocks ----
    HEAD_BLOCK_ELEMS = 1 << 24  # logits of one block: at most 64 MiB of float32

    def _head(self, e, inv, y, cnt, scale, n, grads):
        """Loss (mean CE over the n tokens) and d(loss*scale)/de for the U distinct rows ``e``:
        logits = e @ lm_head[:vocab_size].T, float32, softmax weighted by cnt[u], the targets
        of its tokens subtracted. Under TP the input gradient is the sum of the vocabulary
        shards' partial products (ColumnParallelLinear + the vocab-parallel cross-entropy),
        shards of the padded vocabulary.

        With LLaMA 3's 128256-token vocabulary the head was three quarters of a run's time,
        so nothing here is vocabulary-sized: a row's forward (its softmax terms, and their
        products with each shard of the head) comes from the step's _HeadForward, as rows
        recur in every microbatch of a step, and lm_head's gradient is a _HeadGradient, made
        dense once per step, after the DP ranks are summed (HeadGradient.dense)."""
        cfg, P = self.cfg, self.P
        V = cfg.vocab_size
        W = P["lm_head.weight"]
        tp = self.num.tp
        if self._head_forward is None:
            ks = W.shape[0] // tp if tp > 1 else V
            shards = [(r * ks, min((r + 1) * ks, V)) for r in range(tp)] if tp > 1 else [(0, V)]
            self._head_forward = _HeadForward(self._r(W[:V]), [(a, b) for a, b in shards if a < b],
                                              self._r, self.HEAD_BLOCK_ELEMS)
        forward = self._head_forward
        eq = self._r(e)
        at = forward.rows(eq)
        row = at[inv]  # each token's cache row
        se = forward.se[at, 0]
        logp = forward.shifted[row, y] - np.log(se[inv])
        f = F32(scale / n)
        w = (cnt.astype(F32) * f) / se  # d loss / d exp(logit), per row: cnt * scale / (n * se)
        de = None
        for (a, b), EW in zip(forward.shards, forward.EW):
            inside = (y >= a) & (y < b)
            targets = np.zeros_like(eq)
            np.add.at(targets, inv[inside], forward.Wq[y[inside]])
            part = w[:, None] * EW[at] - f * targets
            de = part if de is None else de + part
        if not self.num.frozen_base:
            grads["lm_head.weight"] = HeadGradient(forward, at, w[:, None] * eq,
                                                   RowGradient(W.shape, y, -f * eq[inv]))
        loss = F32(-logp.mean(dtype=F32))
        return loss, de

    # ---- module outputs: the planted module (STANDIN_PLANT_MODULE) and the trace ----
    def _out(self, name: str, y: np.ndarray, rec: dict | None) -> np.ndarray:
        """Module ``name``'s forward output: scaled when it is the planted module, recorded
        (per distinct row) when a trace is taken. Unplanted and untraced: ``y`` itself."""
        plant = self.num.plant_module
        if plant is not None and plant[0] == name:
            y = (y * F32(plant[1])).astype(F32)
        if rec is not None:
            rec[name] = y
        return y

    # ---- one microbatch: loss and gradients of (loss * scale) ----
    def forward_backward(self, x: np.ndarray, y: np.ndarray, pos: np.ndarray, scale: float,
                         trace: dict | None = None):
        """Loss and gradients of one microbatch. With ``trace`` (a dict), it is filled for
        precision_check.py: ``trace["forward"]`` module name -> forward output per token
        (rows in token order; wpe's per position, the loss a scalar), ``trace["backward"]``
        module name -> the gradient of (loss * scale) w.r.t. that output, per token (the
        backward run again over the tokens, see _trace_backward). The loss and gradients are
        those of a call without a trace, bit for bit."""
        cfg, P = self.cfg, self.P
        gpt2 = cfg.family == "gpt2"
        C = cfg.n_embd
        grads: dict[str, np.ndarray] = {}
        n = x.shape[0]
        rec = {} if trace is not None else None
        # Every token's function depends only on (token, position) (GPT-2) or the token (LLaMA 3),
        # so the forward and backward run once per distinct input; the head weights each
        # distinct row's softmax by its count (exact: the backward is linear in dlogits).
        key = x.astype(np.int64) * (int(pos.max()) + 1) + pos if gpt2 else x.astype(np.int64)
        _, first, inv, cnt = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        xu, pu = x[first], pos[first]
        h = self._out("transformer.wte", P["transformer.wte.weight"][xu], rec)
        if gpt2:
            wpe = P["transformer.wpe.weight"]
            plant = self.num.plant_module
            if plant is not None and plant[0] == "transformer.wpe":
                wpe = (wpe * F32(plant[1])).astype(F32)
            if rec is not None:  # the module's output: the positions 0..T-1 embedded, (T, C)
                rec["transformer.wpe"] = wpe[:int(pos.max()) + 1]
            h = h + wpe[pu]
        h = self._out("TransformerFirstStage", h, rec)
        caches = []
        for i in range(cfg.n_layer):
            p = f"transformer.h.{i}."
            lc = {"h0": h}
            g1 = P[p + "ln_1.weight"]
            a = self._out(p + "ln_1", h * g1 + (P[p + "ln_1.bias"] if gpt2 else 0), rec)
            q, lc["qkv"] = self._lin(a, p + "attn.c_attn")
            q = self._out(p + "attn.c_attn", q, rec)
            z = np.tanh(q)
            s = z[:, :C] + z[:, C:].mean(axis=1, keepdims=True, dtype=F32)
            o, lc["proj"] = self._lin(s, p + "attn.c_proj")
            o = self._out(p + "attn", self._out(p + "attn.c_proj", o, rec), rec)
            lc["z"] = z
            h = h + o
            lc["h1"] = h
            m = self._out(p + "ln_2", h * P[p + "ln_2.weight"] + (P[p + "ln_2.bias"] if gpt2 else 0), rec)
            u, lc["fc"] = self._lin(m, p + "mlp.c_fc")
            u = self._out(p + "mlp.c_fc", u, rec)
            if gpt2:
                f = np.tanh(u)
                lc["f"] = f
                f = self._out(p + "mlp.gelu", f, rec)
            else:
                v, lc["fc2"] = self._lin(m, p + "mlp.c_fc2")
                v = self._out(p + "mlp.c_fc2", v, rec)
                tv = np.tanh(v)
                lc["u"], lc["tv"] = u, tv
                f = u * self._out(p + "mlp.silu", tv, rec)
            r_, lc["mproj"] = self._lin(f, p + "mlp.c_proj")
            r_ = self._out(p + "mlp", self._out(p + "mlp.c_proj", r_, rec), rec)
            h = self._out(f"transformer.h.{i}", h + r_, rec)
            caches.append(lc)
        rs = (F32(1.0) / np.sqrt((h * h).mean(axis=1, keepdims=True, dtype=F32) + NORM_EPS)).astype(F32)
        hf = h * rs  # RMS-normalised final hidden state
        e = self._out("transformer.ln_f",
                      hf * P["transformer.ln_f.weight"] + (P["transformer.ln_f.bias"] if gpt2 else 0), rec)
        loss, de = self._head(e, inv, y, cnt, scale, n, grads)
        if not self.num.frozen_base:
            _acc(grads, "transformer.ln_f.weight", (de * hf).sum(0))
            if gpt2:
                _acc(grads, "transformer.ln_f.bias", de.sum(0))
        dn = de * P["transformer.ln_f.weight"]
        dh = rs * dn - hf * (rs * (dn * hf).mean(axis=1, keepdims=True, dtype=F32))
        dh = self._backward_layers(dh, caches, grads, None)
        if not self.num.frozen_base:  # vocabulary-sized: summed as rows, made dense per step
            grads["transformer.wte.weight"] = RowGradient(P["transformer.wte.weight"].shape, xu, dh)
            if gpt2:
                gp = np.zeros_like(P["transformer.wpe.weight"])
                np.add.at(gp, pu, dh)
                grads["transformer.wpe.weight"] = gp
        if trace is not None:
            trace["forward"] = {k: (v if k == "transformer.wpe" else v[inv]) for k, v in rec.items()}
            trace["forward"]["lm_head"], trace["forward"]["CrossEntropyLoss"] = self._trace_logits(e)[inv], loss
            trace["backward"] = self._trace_backward(e, inv, y, scale, n, rs, hf, caches, pos, x.shape[0])
        return loss, grads

    def _backward_layers(self, dh, caches, grads, rec):
        """The blocks' backward, last to first, from dh (the gradient at the last block's
        output); rec (a dict or None) takes each module's output gradient."""
        cfg, P = self.cfg, self.P
        gpt2 = cfg.family == "gpt2"
        C = cfg.n_embd
        for i in reversed(range(cfg.n_layer)):
            p = f"transformer.h.{i}."
            lc = caches[i]
            if rec is not None:
                rec[f"transformer.h.{i}"] = rec[p + "mlp"] = rec[p + "mlp.c_proj"] = dh
            # mlp
            df = self._lin_bwd(dh, lc["mproj"], grads)
            if gpt2:
                du = df * (1 - lc["f"] * lc["f"])
                if rec is not None:
                    rec[p + "mlp.gelu"], rec[p + "mlp.c_fc"] = df, du
                dm = self._lin_bwd(du, lc["fc"], grads)
            else:
                tv = lc["tv"]
                du = df * tv
                dv = df * lc["u"] * (1 - tv * tv)
                if rec is not None:
                    rec[p + "mlp.c_fc"], rec[p + "mlp.silu"], rec[p + "mlp.c_fc2"] = du, df * lc["u"], dv
                dm = self._lin_bwd(du, lc["fc"], grads) + self._lin_bwd(dv, lc["fc2"], grads)
            if rec is not None:
                rec[p + "ln_2"] = dm
            if not self.num.frozen_base:
                _acc(grads, p + "ln_2.weight", (dm * lc["h1"]).sum(0))
                if gpt2:
                    _acc(grads, p + "ln_2.bias", dm.sum(0))
            dh = dh + dm * P[p + "ln_2.weight"]
            if rec is not None:
                rec[p + "attn"] = rec[p + "attn.c_proj"] = dh
            # attention stand-in
            ds = self._lin_bwd(dh, lc["proj"], grads)
            z = lc["z"]
            nkv = z.shape[1] - C
            dz = np.empty_like(z)
            dz[:, :C] = ds
            dz[:, C:] = (ds.sum(axis=1, keepdims=True) / F32(nkv))
            dq = dz * (1 - z * z)
            da = self._lin_bwd(dq, lc["qkv"], grads)
            if rec is not None:
                rec[p + "attn.c_attn"], rec[p + "ln_1"] = dq, da
            if not self.num.frozen_base:
                _acc(grads, p + "ln_1.weight", (da * lc["h0"]).sum(0))
                if gpt2:
                    _acc(grads, p + "ln_1.bias", da.sum(0))
            dh = dh + da * P[p + "ln_1.weight"]
        return dh

    # ---- the trace (precision_check.py): per token, only when asked ----
    def _head_rows(self) -> int:
        """Rows of the head a TP>1 rank's logits cover: the padded vocabulary (ColumnParallel
        over it); one device: vocab_size."""
        return self.P["lm_head.weight"].shape[0] if self.num.tp > 1 else self.cfg.vocab_size

    def _trace_logits(self, e):
        """lm_head's output per distinct row: e @ lm_head.T over _head_rows()."""
        Wq = self._r(self.P["lm_head.weight"][:self._head_rows()])
        return self._r(self._r(e) @ Wq.T)

    def _trace_backward(self, e, inv, y, scale, n, rs, hf, caches, pos, ntok):
        """Every module's output gradient per token: the head's per token (softmax less the
        one-hot target, times scale / n, from the step's cached head forward), then the
        model's own backward (_backward_layers) over the tokens' caches, into scratch grads."""
        cfg, P = self.cfg, self.P
        gpt2 = cfg.family == "gpt2"
        forward = self._head_forward
        eq = self._r(e)
        at = forward.rows(eq)
        row = at[inv]
        f = F32(scale / n)
        w = (f / forward.se[row, 0]).astype(F32)  # per token: scale / (n * se)
        rows_all = self._head_rows()
        dl = np.zeros((ntok, rows_all), F32)
        dl[:, :forward.exp.shape[1]] = forward.exp[row] * w[:, None]
        dl[np.arange(ntok), y] -= f
        de = None
        for (a, b), EW in zip(forward.shards, forward.EW):
            inside = (y >= a) & (y < b)
            targets = np.zeros((ntok, eq.shape[1]), F32)
            targets[inside] = forward.Wq[y[inside]]
            part = w[:, None] * EW[row] - f * targets
            de = part if de is None else de + part
        rec = {"CrossEntropyLoss": F32(scale), "lm_head": dl, "transformer.ln_f": de}
        dn = de * P["transformer.ln_f.weight"]
        rs_t, hf_t = rs[inv], hf[inv]
        dh = rs_t * dn - hf_t * (rs_t * (dn * hf_t).mean(axis=1, keepdims=True, dtype=F32))
        tok_caches = [_tok_cache(lc, inv) for lc in caches]
        dh = self._backward_layers(dh, tok_caches, {}, rec)
        rec["TransformerFirstStage"] = rec["transformer.wte"] = dh
        if gpt2:
            T = int(pos.max()) + 1
            rec["transformer.wpe"] = dh.reshape(-1, T, dh.shape[1]).sum(0, dtype=F32)
        return rec


def _tok_cache(lc: dict, inv: np.ndarray) -> dict:
    """A layer's cache with every per-row array taken per token (rows[inv])."""
    out = {}
    for k, v in lc.items():
        if isinstance(v, dict):  # a linear's cache: its input (and LoRA's hidden) per row
            v = dict(v)
            v["x"] = v["x"][inv]
            if "hA" in v:
                v["hA"] = v["hA"][inv]
            out[k] = v
        else:
            out[k] = v[inv]
    return out


class _HeadForward:
    """The head's forward for one step's parameters: per distinct input row (keyed by its
    bytes, so a row is reused only when it is bit for bit the same) the logits less their
    maximum, their exponentials, the sum of those, and per vocabulary shard the product of the
    exponentials with the head's rows (EW). Rows are computed in blocks of at most
    `block_elems` logits, in the order they are first asked for."""

    def __init__(self, Wq: np.ndarray, shards: list[tuple[int, int]], rnd, block_elems: int):
        self.Wq, self.shards, self._r, self._block_elems = Wq, shards, rnd, block_elems
        self._index: dict[bytes, int] = {}
        V, C = Wq.shape
        self.shifted = self.exp = np.empty((0, V), F32)
        self.se = np.empty((0, 1), F32)
        self.EW = [np.empty((0, C), F32) for _ in shards]

    @property
    def held(self) -> int:
        """Rows computed so far (the arrays above hold more, unfilled, past these)."""
        return len(self._index)

    def rows(self, eq: np.ndarray) -> np.ndarray:
        """The cache's row of each row of eq, computing those not seen in this step."""
        keys = [row.tobytes() for row in eq]
        pending: dict[bytes, int] = {}
        missing: list[int] = []
        for u, k in enumerate(keys):
            if k not in self._index and k not in pending:
                pending[k] = len(self._index) + len(pending)
                missing.append(u)
        if missing:
            self._compute(eq[missing])
            self._index.update(pending)
        return np.fromiter((self._index[k] for k in keys), dtype=np.int64, count=len(keys))

    def _compute(self, eq: np.ndarray) -> None:
        V, C = self.Wq.shape
        held, need = self.held, self.held + eq.shape[0]
        if need > self.exp.shape[0]:  # grow by doubling: rows keep coming in small numbers
            cap = max(need, 2 * self.exp.shape[0], 64)

            def grown(a, width):
                out = np.empty((cap, width), F32)
                out[:held] = a[:held]
                return out
            self.shifted, self.exp, self.se = (grown(self.shifted, V), grown(self.exp, V),
                                               grown(self.se, 1))
            self.EW = [grown(a, C) for a in self.EW]
        step = max(1, self._block_elems // V)
        for s0 in range(0, eq.shape[0], step):
            at = slice(held + s0, held + min(eq.shape[0], s0 + step))
            l = self._r(eq[s0:s0 + step] @ self.Wq.T)
            if l.dtype != F32:
                l = l.astype(F32)
            l -= l.max(axis=1, keepdims=True)
            self.shifted[at] = l
            np.exp(l, out=l)
            self.exp[at] = l
            self.se[at] = l.sum(axis=1, keepdims=True, dtype=F32)
            for (a, b), EW in zip(self.shards, self.EW):
                EW[at] = l[:, a:b] @ self.Wq[a:b]


class RowGradient:
    """A gradient that is nonzero on a few rows (the embedding's, the head's targets): rows
    and their values; adding two is concatenating, dense() sums them into the matrix."""

    def __init__(self, shape: tuple, rows: np.ndarray, values: np.ndarray):
        self.shape, self.rows, self.values = tuple(shape), rows, values

    def __add__(self, other: "RowGradient") -> "RowGradient":
        if not isinstance(other, RowGradient):
            return NotImplemented
        return RowGradient(self.shape, np.concatenate([self.rows, other.rows]),
                           np.concatenate([self.values, other.values]))

    def dense(self, base: np.ndarray | None = None) -> np.ndarray:
        """The rows summed into `base` (in place), or into zeros."""
        g = np.zeros(self.shape, F32) if base is None else base
        np.add.at(g, self.rows, self.values)
        return g


class HeadGradient:
    """lm_head's gradient of some microbatches of one step, kept factored: the sum over rows
    u of exp_u (x) weighted_u (exp_u from the step's _HeadForward), plus the targets' rows (a
    RowGradient). Adding two is concatenating; dense() makes the (padded) matrix."""

    def __init__(self, forward: _HeadForward, rows: np.ndarray, weighted: np.ndarray,
                 targets: RowGradient):
        self.forward, self.rows, self.weighted, self.targets = forward, rows, weighted, targets

    def __add__(self, other: "HeadGradient") -> "HeadGradient":
        if not isinstance(other, HeadGradient) or other.forward is not self.forward:
            return NotImplemented
        return HeadGradient(self.forward, np.concatenate([self.rows, other.rows]),
                            np.concatenate([self.weighted, other.weighted]),
                            self.targets + other.targets)

    def dense(self) -> np.ndarray:
        n, (V, C) = self.forward.held, self.forward.Wq.shape
        per_row = np.zeros((n, C), F32)
        np.add.at(per_row, self.rows, self.weighted)
        g = np.zeros(self.targets.shape, F32)
        g[:V] = self.forward.exp[:n].T @ per_row
        return self.targets.dense(g)


def dense(grads: dict) -> dict:
    """The gradients with lm_head's and the embedding's made dense: call once per step, after
    the microbatches and the DP ranks are summed."""
    return {k: v.dense() if isinstance(v, (HeadGradient, RowGradient)) else v
            for k, v in grads.items()}


def _acc(grads, name, g):
    g = g.astype(F32, copy=False)
    if name in grads:
        grads[name] = grads[name] + g
    else:
        grads[name] = g
