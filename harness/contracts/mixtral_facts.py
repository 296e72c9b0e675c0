"""tiny_mixtral's mathematics as facts, each with its source line and the bundled trainer's answer.

What InfiniTrain feat/support_moe's ``tiny_mixtral`` computes, fact by fact, and what the bundled
trainer's ``mixtral`` family (harness/trainer/models/mixtral/) does about it: the data docs table
(``Fact`` is harness.contracts.semantics's). No torch here.

Every source is ``feat/support_moe@b7e0760:<path>:<lines>`` (several joined by "; ").
"""

from __future__ import annotations

from harness.contracts.semantics import Fact, facts_table

REVISION = "InfiniTensor/InfiniTrain feat/support_moe b7e0760"
_TR = "infini_train/src/nn/modules/transformer/"
_MOE = _TR + "moe/"
_CFG = "infini_train/include/nn/modules/transformer/transformer_config.h"
_EX = "example/tiny_mixtral/"


def _at(*refs: tuple[str, str]) -> str:
    """`feat/support_moe@b7e0760:path:lines` for each (path, lines), joined by "; "."""
    return "; ".join(f"feat/support_moe@b7e0760:{path}:{lines}" for path, lines in refs)


MIXTRAL_FACTS: tuple[Fact, ...] = (
    # -- the model's shape and files
    Fact("the shape: TinyMixtralConfig() (32 layers, n_embd 512, 4 heads, 1 KV head, vocabulary "
         "128256, 8 experts, top 2, expert width 1792: 857,113,088 float32 parameters); the "
         "loader CHECK_EQs every header field against it",
         _at((_EX + "config.h", "11-41"), (_EX + "checkpoint_loader.cc", "74-97")),
         "`MixtralConfig()`'s defaults; any consistent shape loads (the synthetic presets are "
         "smaller)"),
    Fact("checkpoint: 256-int32 header, magic 20260513, version 2, config in slots 2-16 "
         "(10 and 11 skipped), float32 only, no trailing bytes",
         _at((_EX + "checkpoint_loader.cc", "22-24, 45-66, 116-117, 163")),
         "`MIXTRAL_SPEC` (harness.contracts.models): the same header and checks; slots 10, 11 "
         "written 0 and not read"),
    Fact("tensor order, layer by layer: wte; per layer ln_1, c_attn (q, k, v rows), c_proj, "
         "ln_2, mlp.router, then per expert c_fc2 (gate), c_fc (up), c_proj (down); ln_f, "
         "lm_head", _at((_EX + "checkpoint_loader.cc", "139-161")),
         "the same order (`ModelSpec.layer_major`); names without InfiniTrain's `transformer.` "
         "prefix: `h.{i}.mlp.experts.expert_{e}.c_fc.weight`"),
    Fact("tokens: LLaMA 3's uint32 token files (magic 20240801)",
         _at(("example/common/tiny_shakespeare_dataset.cc", "27-30")),
         "the mixtral family reads LLaMA 3's token format"),
    # -- attention
    Fact("pre-norm residual blocks: x + attn(ln_1(x)), then x + moe(ln_2(x)); no position "
         "embedding (RoPE)", _at((_TR + "transformer.cc", "33-35, 97-121")),
         "the same (`Block.forward`)"),
    Fact("RMSNorm: x * rsqrt(mean(x^2) + norm_eps) * weight, eps from the header",
         _at(("infini_train/src/nn/modules/normalization.cc", "40-43"),
             (_TR + "transformer.cc", "81-83, 177-178")),
         "llama3's `RMSNorm` (float32: the same arithmetic)"),
    Fact("fused c_attn rows [q; k; v]; GQA: each of the n_kv_head k/v heads repeated for "
         "n_head / n_kv_head consecutive q heads",
         _at((_TR + "causal_self_attention.cc", "169-179, 204-212, 224-225")),
         "llama3's `CausalSelfAttention` (repeat_interleave)"),
    Fact("RoPE on interleaved pairs (x[2j], x[2j+1]), frequencies 1 / rope_theta^(2j/hd) in "
         "float32, rope_theta from the header (1e6)",
         _at((_TR + "causal_self_attention.cc", "142-166"), (_TR + "utils.cc", "13-26"),
             (_TR + "transformer.cc", "143-145")),
         "llama3's `precompute_rope` / `apply_rope` with the config's rope_theta"),
    Fact("no scaled RoPE: PrecomputeFreqsCis ignores use_scaled (a TODO) and the program "
         "refuses use_scaled_rope", _at((_TR + "utils.cc", "15-18"), (_EX + "config.h", "61")),
         "`MixtralConfig` refuses use_scaled_rope=True"),
    Fact("causal softmax attention scaled by 1/sqrt(head_dim) (mask filled with the lowest "
         "float)",
         _at((_TR + "causal_self_attention.cc", "241-247"), (_TR + "transformer.cc", "154-156")),
         "`scaled_dot_product_attention(is_causal=True)`"),
    # -- the mixture of experts
    Fact("router: a bias-free Linear n_embd -> num_experts on ln_2's output (add_bias_linear "
         "false)", _at((_MOE + "router.cc", "23-27, 39-44"), (_MOE + "moe_layer.cc", "25-30"),
                       (_EX + "config.h", "24")),
         "`mlp.router` = Linear(n_embd, num_experts, bias=False)"),
    Fact("routing: top-k (largest, sorted) of the raw router logits, then softmax over the k "
         "selected logits (router_pre_softmax false, score function softmax, no scaling "
         "factor): the same weights as Mixtral's softmax-then-renormalise",
         _at((_MOE + "moe_utils.cc", "26-37, 50-52"), (_CFG, "46-48"),
             ("infini_train/include/autograd/topk.h", "21")),
         "`logits.topk(k)` then `softmax` over the k; no gradient reaches an unselected logit"),
    Fact("no auxiliary (load-balancing) loss: aux_loss_coeff 0 is read nowhere, the router "
         "returns only the probabilities and the map",
         _at((_CFG, "49"), (_MOE + "router.cc", "52-54")), "the loss is the cross-entropy alone"),
    Fact("no capacity, no token dropping, no padding: every token reaches its k experts "
         "(expert_capacity_factor unset)",
         _at((_CFG, "50-51"), (_MOE + "moe_utils.cc", "86-96")),
         "every token is dispatched to its k experts"),
    Fact("an expert is the SwiGLU MLP of width moe_ffn_hidden_size: c_proj(c_fc(x) * "
         "silu(c_fc2(x))), c_fc2 the gated one; no biases",
         _at((_TR + "mlp.cc", "41-46, 90-101"),
             ("infini_train/src/nn/modules/activations.cc", "21-23")),
         "llama3's `MLP` with ffn_dim = moe_ffn_hidden_size"),
    Fact("combine: each expert's output times its routing weight, scatter-added into the token "
         "rows, experts in index order (all experts local, no communication)",
         _at((_MOE + "experts.cc", "42-62"), (_MOE + "moe_utils.cc", "153-167"),
             (_MOE + "token_dispatcher.cc", "53-58, 85-88")),
         "`index_add` per expert in index order"),
    Fact("an expert no token chose is not run, so its weights get no gradient that step",
         _at((_MOE + "experts.cc", "47-50")), "the same: its `.grad` stays None"),
    # -- the head, loss, optimizer
    Fact("no biases, untied lm_head", _at((_EX + "config.h", "24-26")),
         "bias=False, a separate lm_head"),
    Fact("loss: mean token cross-entropy, divided by the gradient-accumulation steps",
         _at((_EX + "main.cc", "101, 125-131")),
         "the bundled trainer's `cross_entropy` per microbatch"),
    Fact("Adam at --learning_rate, betas (0.9, 0.999), eps 1e-8, no weight decay, "
         "bias-corrected with ONE step count t for all parameters; a parameter with no "
         "gradient is skipped (t still advances)",
         _at((_EX + "main.cc", "102-103"), ("infini_train/include/optimizer.h", "49-50"),
             ("infini_train/src/optimizer.cc", "53-70"),
             ("infini_train/src/kernels/cpu/accumulate_grad.cc", "22-33")),
         "`--optimizer adamw --weight_decay 0 --adam_beta2 0.999`; torch counts steps per "
         "parameter, so an expert skipped in a step is bias-corrected with a smaller t "
         "afterwards (equal while every expert gets a token every step)"),
    Fact("one device only: InitAllEnv(1, 1, false, 1, 1); no TP / PP / DP flags",
         _at((_EX + "main.cc", "61-66")),
         "the mixtral family also runs PP, DP, TP and SP (the bundled "
         "trainer's own layouts, checked against its single-device run)"),
)


def fact_table() -> list[str]:
    """The facts as a markdown table (docs/infinitrain_baseline.md holds it; a test keeps them equal)."""
    return facts_table(MIXTRAL_FACTS, REVISION)
