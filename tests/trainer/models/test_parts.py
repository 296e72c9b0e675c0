"""Model parts (pipeline stages / chunks), load_weights, TP-shardable attention, no distributed.

Splitting a model by layer ranges and chaining the parts must give the whole model's logits and
gradients under the same names; attention must run unchanged on a tensor-parallel shard of
c_attn / c_proj whose rows are re-arranged to [q_i; k_i; v_i].
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import harness.trainer.models as models_pkg
from harness.trainer.models import (
    GPT2,
    GPT2Config,
    LLaMA3,
    LLaMA3Config,
    MixtralConfig,
    build_model,
    load_weights,
    source_name,
)

GPT2_CONFIG = GPT2Config(
    block_size=32, vocab_size=50, n_layer=3, n_head=4, n_embd=32, padded_vocab_size=64
)
LLAMA_CONFIG = LLaMA3Config(
    block_size=32, vocab_size=50, n_layer=3, n_head=4, n_kv_head=2, n_embd=32, multiple_of=16
)
MIXTRAL_CONFIG = MixtralConfig(
    block_size=32, vocab_size=50, n_layer=3, n_head=4, n_kv_head=2, n_embd=32, num_experts=4,
    router_topk=2, moe_ffn_hidden_size=24,
)
CONFIGS = {"gpt2": GPT2_CONFIG, "llama3": LLAMA_CONFIG, "mixtral": MIXTRAL_CONFIG}

# (layers, embedding, final_norm, lm_head) per part: first, empty, middle, last
SPLIT = [
    ([0], True, False, False),
    ([], False, False, False),
    ([1], False, False, False),
    ([2], False, True, True),
]


def whole_and_tensors(kind: str, seed: int = 0):
    whole = build_model(CONFIGS[kind])
    whole.init_weights(seed)
    with torch.no_grad():  # make norms and biases non-trivial too
        g = torch.Generator().manual_seed(seed + 100)
        for p in whole.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    tensors = {k: v.detach().numpy().copy() for k, v in whole.state_dict().items()}
    return whole, tensors


def make_parts(kind: str, tensors):
    parts = []
    for layers, emb, norm, head in SPLIT:
        part = build_model(CONFIGS[kind], layers, embedding=emb, final_norm=norm, lm_head=head)
        load_weights(part, tensors)
        parts.append(part)
    return parts


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "mixtral"])
def test_parts_compose_to_the_whole_model(kind):
    whole, tensors = whole_and_tensors(kind)
    parts = make_parts(kind, tensors)
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(2))

    x = idx
    for part in parts:
        x = part(x)
    logits = whole(idx)
    assert x.shape == logits.shape == (2, 12, 50)
    torch.testing.assert_close(x, logits, atol=1e-6, rtol=1e-6)

    # names: the union of the parts' parameters (GPT-2's lm_head standing for wte) is the whole
    whole_names = [n for n, _ in whole.named_parameters()]
    part_names = [source_name(p, n) for p in parts for n, _ in p.named_parameters()]
    assert set(part_names) == set(whole_names)
    if kind == "gpt2":
        assert part_names.count("wte.weight") == 2  # wte on the first part, lm_head on the last
        assert "lm_head.weight" in dict(parts[-1].named_parameters())
    else:
        assert sorted(part_names) == sorted(whole_names)
    assert list(parts[1].parameters()) == []

    # gradients: summed over parts by source name (the tied GPT-2 wte) equal the whole model's
    F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1)).backward()
    F.cross_entropy(x.reshape(-1, 50), targets.reshape(-1)).backward()
    summed: dict[str, torch.Tensor] = {}
    for part in parts:
        for n, p in part.named_parameters():
            key = source_name(part, n)
            summed[key] = summed[key] + p.grad if key in summed else p.grad.clone()
    for n, p in whole.named_parameters():
        torch.testing.assert_close(summed[n], p.grad, atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "mixtral"])
def test_empty_part_is_identity(kind):
    part = build_model(CONFIGS[kind], [], embedding=False, final_norm=False, lm_head=False)
    assert part.is_empty and list(part.parameters()) == [] and part.state_dict() == {}
    h = torch.randn(2, 5, 32, requires_grad=True)
    out = part(h)
    assert out is not h and torch.equal(out, h)
    out.sum().backward()
    assert torch.equal(h.grad, torch.ones_like(h))


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "mixtral"])
def test_layers_keep_global_indices_and_order(kind):
    part = build_model(CONFIGS[kind], [2, 1], embedding=False, final_norm=False, lm_head=False)
    assert list(part.h.keys()) == ["2", "1"]
    assert all(n.startswith(("h.2.", "h.1.")) for n, _ in part.named_parameters())
    with pytest.raises(ValueError, match="outside"):
        build_model(CONFIGS[kind], [3])
    with pytest.raises(ValueError, match="repeated"):
        build_model(CONFIGS[kind], [1, 1])


def test_build_model_rejects_other_configs():
    with pytest.raises(TypeError, match="GPT2Config or LLaMA3Config"):
        build_model(object())


def test_init_weights_agrees_between_parts_and_whole():
    whole = GPT2(GPT2_CONFIG)
    whole.init_weights(7)
    last = GPT2(GPT2_CONFIG, [2], embedding=False)
    last.init_weights(7)
    torch.testing.assert_close(last.lm_head.weight, whole.wte.weight, atol=0, rtol=0)
    torch.testing.assert_close(
        last.h["2"].attn.c_attn.weight, whole.h["2"].attn.c_attn.weight, atol=0, rtol=0
    )


# ---------------------------------------------------------------- load_weights


def test_load_weights_gpt2_lm_head_from_wte():
    _, tensors = whole_and_tensors("gpt2")
    last = GPT2(GPT2_CONFIG, [2], embedding=False)
    used = load_weights(last, tensors)
    assert "wte.weight" in used and "lm_head.weight" not in used
    np.testing.assert_array_equal(last.lm_head.weight.detach().numpy(), tensors["wte.weight"])
    # an explicit lm_head.weight tensor wins
    explicit = dict(tensors, **{"lm_head.weight": np.zeros_like(tensors["wte.weight"])})
    load_weights(last, explicit)
    assert torch.count_nonzero(last.lm_head.weight) == 0


def test_load_weights_is_strict_and_names_missing_keys():
    _, tensors = whole_and_tensors("llama3")
    model = LLaMA3(LLAMA_CONFIG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    partial = {k: v for k, v in tensors.items() if not k.startswith("h.1.mlp")}
    with pytest.raises(ValueError, match=r"missing tensors: .*h\.1\.mlp\.c_fc\.weight"):
        load_weights(model, partial)
    bad = dict(tensors, **{"ln_f.weight": np.ones(7, dtype=np.float32)})
    with pytest.raises(ValueError, match=r"ln_f\.weight: got \(7,\), expected \(32,\)"):
        load_weights(model, bad)
    for k, v in model.state_dict().items():  # nothing was copied on failure
        assert torch.equal(v, before[k]), k
    gpt_last = GPT2(GPT2_CONFIG, [2], embedding=False)
    no_wte = {k: v for k, v in whole_and_tensors("gpt2")[1].items() if k != "wte.weight"}
    with pytest.raises(ValueError, match=r"lm_head\.weight \(from wte\.weight\)"):
        load_weights(gpt_last, no_wte)


def test_load_weights_accepts_readonly_arrays_and_casts_dtype():
    _, tensors = whole_and_tensors("llama3")
    ro = {}
    for k, v in tensors.items():
        v = v.astype(np.float64)
        v.setflags(write=False)
        ro[k] = v
    model = LLaMA3(LLAMA_CONFIG)
    load_weights(model, ro)
    np.testing.assert_allclose(model.wte.weight.detach().numpy(), tensors["wte.weight"])
    assert model.wte.weight.dtype == torch.float32


# ---------------------------------------------------------------- tensor-parallel attention


def shard_rows(n_head: int, n_kv: int, hd: int, tp: int, rank: int) -> torch.Tensor:
    """Rows of fused [q; k; v] that TP rank `rank` holds, as [q_r; k_r; v_r] (whole heads)."""
    q = torch.arange(n_head * hd).view(n_head, hd)
    k = torch.arange(n_kv * hd).view(n_kv, hd) + n_head * hd
    v = k + n_kv * hd
    qh, kvh = n_head // tp, n_kv // tp
    pick = lambda t, n: t[rank * n : (rank + 1) * n].reshape(-1)  # noqa: E731
    return torch.cat([pick(q, qh), pick(k, kvh), pick(v, kvh)])


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
@pytest.mark.parametrize("tp", [2, 4])
def test_attention_runs_on_tp_shards(kind, tp):
    config = CONFIGS[kind]
    if kind == "llama3" and config.n_kv_head % tp:
        config = LLaMA3Config(**{**LLAMA_CONFIG.__dict__, "n_kv_head": tp})
    model = build_model(config, [0], embedding=False, final_norm=False, lm_head=False)
    model.init_weights(3)
    block = model.h["0"]
    x = torch.randn(2, 10, 32)
    args = (x,) if kind == "gpt2" else (x, model._rope_for(10, x.device))
    full = block.attn(*args)

    n_kv = getattr(config, "n_kv_head", config.n_head)
    hd = config.n_embd // config.n_head
    total = torch.zeros_like(full)
    for rank in range(tp):
        shard = copy.deepcopy(block.attn)
        rows = shard_rows(config.n_head, n_kv, hd, tp, rank)
        cols = torch.arange(config.n_embd).view(tp, -1)[rank]  # c_proj: row-parallel input
        with torch.no_grad():
            w = block.attn.c_attn.weight[rows]
            b = block.attn.c_attn.bias
            shard.c_attn = torch.nn.Linear(config.n_embd, len(rows), bias=b is not None)
            shard.c_attn.weight.copy_(w)
            if b is not None:
                shard.c_attn.bias.copy_(b[rows])
            pb = block.attn.c_proj.bias
            shard.c_proj = torch.nn.Linear(len(cols), config.n_embd, bias=pb is not None)
            shard.c_proj.weight.copy_(block.attn.c_proj.weight[:, cols])
            if pb is not None:  # the bias is added once, after the reduction
                shard.c_proj.bias.copy_(pb if rank == 0 else torch.zeros_like(pb))
        total += shard(*args)
    torch.testing.assert_close(total, full, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- no torch.distributed


def test_models_never_import_torch_distributed():
    # `import torch` itself loads torch.distributed, so sys.modules proves nothing: read the
    # sources instead: every import statement (including function-local ones), every dotted name.
    # A family's parallelize.py is the one file beside its model that does (its TP plan); the
    # model file does not import that plan, nor harness.trainer.parallel.
    folder = Path(models_pkg.__file__).parent
    files = sorted(f for f in folder.rglob("*.py") if f.name != "parallelize.py")
    from harness.trainer.models.registry import TRAIN_SPECS
    families = set(TRAIN_SPECS)  # one folder each: gpt2, llama3, qwen3, mixtral
    assert {f"{name}/model.py" for name in families} | {"__init__.py"} <= \
        {str(f.relative_to(folder)) for f in files}
    assert {f.parent.name for f in folder.rglob("parallelize.py")} == families
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            if isinstance(node, ast.Attribute):  # torch.distributed.x used without an import
                names = [dotted(node)]
            for name in names:
                assert not name.startswith("torch.distributed"), f"{f.name} uses {name}"
                if f.name == "model.py":
                    assert not name.startswith("harness.trainer.parallel") \
                        and not name.endswith(".parallelize"), f"{f} imports {name}"
        for dynamic in ("import_module", "__import__"):
            assert dynamic not in f.read_text(), f"{f.name}: {dynamic}"


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"
