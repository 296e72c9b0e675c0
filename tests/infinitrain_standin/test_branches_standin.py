"""Tests of the stand-in's feature-branch flavours (lr_scheduler, qwen3, support_moe's tiny_mixtral,
context_parallel, activation_checkpointing). Each run is a subprocess of the built scripts."""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

from tests.infinitrain_standin import lr_schedule, tiny_mixtral
from tests.infinitrain_standin.build import make_build_dir

FLAG_RE = re.compile(r"<flag><file>([^<]*)</file><name>([^<]*)</name>")
GFLAGS_OWN = {"flagfile", "fromenv", "tryfromenv", "undefok", "tab_completion_word", "tab_completion_columns",
              "help", "helpfull", "helpshort", "helpon", "helpmatch", "helppackage", "helpxml", "version"}
# master b24d92f example/gpt2/main.cc:46-100 and example/llama3/main.cc:46-97 (same names)
MASTER = {"input_bin", "input_val_bin", "tokenizer_bin", "llmc_filepath", "model", "batch_size", "sequence_length",
          "total_batch_size", "num_iteration", "freq_generate_txt", "text_length", "learning_rate", "zero_stage",
          "val_loss_every", "sample_every", "overfit_single_batch", "device", "nthread_per_process",
          "tensor_parallel", "sequence_parallel", "pipeline_parallel", "virtual_pipeline_parallel", "dtype",
          "save_interval", "load", "save", "max_checkpoint_keep", "save_optimizer_state", "precision_check",
          "lora_rank", "lora_alpha", "lora_target_modules", "lora_save_path", "lora_load_path"}
EXPECTED = {
    # feat/lr_scheduler:example/gpt2/main.cc:67-71 (llama3/main.cc:66-70)
    "lr_scheduler": MASTER | {"min_lr", "lr_decay_style", "lr_warmup_iters", "lr_warmup_init", "lr_decay_iters"},
    # feat/add_Qwen3-8B:example/gpt2/main.cc:60 (llama3/main.cc:59) adds use_distributed_optimizer; the
    # branch has no checkpoint / ZeRO flags
    "qwen3": (MASTER - {"load", "max_checkpoint_keep", "save", "save_interval", "save_optimizer_state",
                        "zero_stage"}) | {"use_distributed_optimizer"},
    # feat/support_moe: gpt2 / llama3 main.cc DEFINE the same 34 as master
    "support_moe": MASTER,
    # feat/context_parallel:example/gpt2/main.cc:82-83 (llama3/main.cc:81-82)
    "context_parallel": MASTER | {"context_parallel", "cp_comm_type"},
    # feat/activation_checkpointing:example/gpt2/main.cc:83-86 (llama3/main.cc:82-85)
    "activation_checkpointing": MASTER | {"activation_recompute", "recompute_granularity", "recompute_method",
                                          "recompute_num_layers"},
}
# feat/support_moe:example/tiny_mixtral/main.cc:24-35
TINY_MIXTRAL = {"input_bin", "micro_batch_size", "global_batch_size", "sequence_length", "num_iteration",
                "learning_rate", "llmc_filepath", "device", "dtype", "log_interval", "print_timing"}
MIXTRAL_STEP_RE = re.compile(r"^step +(\d+)/(\d+) \| train loss (\d+\.\d{6}) \| norm -1\.0000 \| lr \d\.\d\de[-+]\d\d"
                             r" \| \(\d+\.\d\d ms \| \d+ tok/s\)$")
CP_STEP_RE = re.compile(r"^E\d{8} .*main\.cc:\d+\] step +(\d+)/\d+ \| train loss (\d+\.\d{6}) \| lr (\S+) \| .*"
                        r"DP=(\d+), TP=(\d+), SP=(\d+), CP=(\d+), PP=(\d+)\)$")
STEP_RE = re.compile(r"^E\d{8} .*main\.cc:\d+\] step +(\d+)/\d+ \| train loss (\d+\.\d{6}) \| lr (\S+) \| ")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("branches")
    return {f: make_build_dir(root / f, flavour=f) for f in EXPECTED} | {
        "support_moe_cpu": make_build_dir(root / "moe_cpu", flavour="support_moe", cuda=False),
        "support_moe_file": make_build_dir(root / "moe_file", flavour="support_moe", mixtral_config="file")}


@pytest.fixture(scope="module")
def assets():
    from harness.assets import ensure_assets
    return ensure_assets("infinitrain")


def run(prog, *args, cwd, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "STANDIN_", "PROC_", "GLOBAL_PROC"))}
    e.update(env or {})
    return subprocess.run([str(prog), *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


def common(a, model="gpt2"):
    return ["--llmc_filepath", str(a.checkpoint(model)), "--input_bin", str(a.tokens(model, "train")),
            "--learning_rate", "1e-3", "--total_batch_size", "1024", "--num_iteration", "3"]


@pytest.mark.subprocess
def test_helpxml_flag_sets(builds, tmp_path):
    for flavour, want in EXPECTED.items():
        for model in ("gpt2", "llama3"):
            p = run(builds[flavour] / model, "--helpxml", cwd=tmp_path)
            assert p.returncode == 1
            got = FLAG_RE.findall(p.stdout)
            assert {n for f, n in got if f == f"example/{model}/main.cc"} == want, (flavour, model)
            assert {n for f, n in got if not f.startswith("example/")} == GFLAGS_OWN
    p = run(builds["support_moe"] / "tiny_mixtral", "--helpxml", cwd=tmp_path)
    got = FLAG_RE.findall(p.stdout)
    assert p.returncode == 1 and {n for f, n in got if f == "example/tiny_mixtral/main.cc"} == TINY_MIXTRAL
    assert len(got) == len(TINY_MIXTRAL) + len(GFLAGS_OWN)
    assert sorted(x.name for x in builds["support_moe"].iterdir() if x.is_file()) == [
        "gpt2", "infini_run", "llama3", "tiny_mixtral"]
    assert not (builds["lr_scheduler"] / "tiny_mixtral").exists()
    with pytest.raises(ValueError):
        make_build_dir(tmp_path / "x", flavour="qwen3", models=("tiny_mixtral",))
    # validators: gflags' refusal (exit 1)
    p = run(builds["lr_scheduler"] / "gpt2", "--lr_decay_style=cos", cwd=tmp_path)
    assert p.returncode == 1 and "failed validation of new value 'cos' for flag 'lr_decay_style'" in p.stderr
    p = run(builds["context_parallel"] / "llama3", "--cp_comm_type=ring", cwd=tmp_path)
    assert p.returncode == 1 and "failed validation of new value 'ring' for flag 'cp_comm_type'" in p.stderr
    p = run(builds["qwen3"] / "gpt2", "--save=x", cwd=tmp_path)
    assert p.returncode == 1 and "unknown command line flag 'save'" in p.stderr


def _mixtral_losses(p) -> list[float]:
    return [float(m.group(3)) for m in map(MIXTRAL_STEP_RE.match, p.stdout.splitlines()) if m]


@pytest.mark.subprocess
def test_tiny_mixtral(builds, assets, tmp_path):
    """The real tiny Mixtral of a small checkpoint, on a build compiled with the file's config."""
    ck = tiny_mixtral.write_checkpoint(tmp_path / "mixtral.bin", weights=True, **tiny_mixtral.SMALL_CONFIG)
    exe = builds["support_moe_file"] / "tiny_mixtral"
    args = ["--llmc_filepath", ck, "--input_bin", str(assets.tokens("llama3", "train")), "--sequence_length=32"]
    p = run(exe, *args, "--global_batch_size=8", "--micro_batch_size=8", "--learning_rate=1e-3", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 11 and all(MIXTRAL_STEP_RE.match(l) for l in lines[:10]), lines
    assert re.fullmatch(r"final 9 iters avg: \d+\.\d{3}ms", lines[10])
    loss = _mixtral_losses(p)
    assert abs(loss[0] - np.log(256)) < 0.1 and loss[-1] < loss[0] - 0.1  # 256 tokens, and it learns
    # --log_interval prints every 4th and the last: the same numbers (a run is deterministic)
    p = run(exe, *args, "--global_batch_size=8", "--micro_batch_size=8", "--learning_rate=1e-3", "--log_interval=4",
            cwd=tmp_path)
    assert [l.split("|")[0].strip() for l in p.stdout.splitlines()[:-1]] == ["step    4/10", "step    8/10",
                                                                               "step   10/10"]
    assert _mixtral_losses(p) == [loss[3], loss[7], loss[9]]
    # accumulation: 8 = 2 x 4 gives the same first-step loss within float noise (on a CUDA build,
    # --device=cuda trains too)
    ga = run(exe, *args, "--global_batch_size=8", "--micro_batch_size=2", "--num_iteration=1", "--device=cuda",
             cwd=tmp_path)
    assert len(ga.stdout.splitlines()) == 2 and abs(_mixtral_losses(ga)[0] - loss[0]) < 2e-6
    # the planted router (softmax over every expert, then top k): other losses
    planted = run(exe, *args, "--global_batch_size=8", "--micro_batch_size=8", "--learning_rate=1e-3",
                  "--num_iteration=3", env={"STANDIN_PLANT_ROUTER": "other_order"}, cwd=tmp_path)
    assert planted.returncode == 0 and max(abs(a - b) for a, b in zip(_mixtral_losses(planted), loss)) > 1e-4
    bad = run(exe, *args, env={"STANDIN_PLANT_ROUTER": "pre"}, cwd=tmp_path)
    assert bad.returncode == 2 and "STANDIN_PLANT_ROUTER must be one of other_order (got 'pre')" in bad.stderr
    # its checks
    p = run(exe, *args, "--global_batch_size=10", "--micro_batch_size=4", cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"^F\d{8} .*main\.cc:49\] Check failed: FLAGS_global_batch_size % "
                                            r"FLAGS_micro_batch_size == 0 \(2 vs\. 0\) global_batch_size must be "
                                            r"divisible by micro_batch_size", p.stderr, re.M)
    p = run(exe, *args, "--sequence_length=65", cwd=tmp_path)  # the emulated build's block_size is the file's
    assert p.returncode == -6 and "main.cc:52] Check failed: FLAGS_sequence_length <= config.block_size (65 vs. 64)" \
        in p.stderr
    p = run(exe, *args, "--nthread_per_process=2", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr == "ERROR: unknown command line flag 'nthread_per_process'\n"
    p = run(builds["support_moe_cpu"] / "tiny_mixtral", *args, "--device=cuda",
            env={"STANDIN_MIXTRAL_CONFIG": "file"}, cwd=tmp_path)  # the variable plays the build option
    assert p.returncode == -6 and "device_guard.cc:161" in p.stderr
    p = run(exe, "--input_bin", args[3], cwd=tmp_path)  # no file: the stand-in does not build config.h's model
    assert p.returncode == 2 and "no --llmc_filepath" in p.stderr


@pytest.mark.subprocess
def test_tiny_mixtral_loader(builds, assets, tmp_path):
    """checkpoint_loader.cc's checks: the header against the compiled-in config (config.h's by
    default), then every tensor, then no trailing byte."""
    tokens = ["--input_bin", str(assets.tokens("llama3", "train"))]
    exe, small = builds["support_moe"] / "tiny_mixtral", tiny_mixtral.SMALL_CONFIG
    p = run(exe, *tokens, "--llmc_filepath", tiny_mixtral.write_checkpoint(tmp_path / "bad.bin", magic=20240803),
            cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"^F\d{8} .*checkpoint_loader\.cc:45\] Check failed: .*== "
                                            r"kTinyMixtralLLMCMagic \(20240803 vs\. 20260513\)", p.stderr, re.M)
    p = run(exe, *tokens, "--llmc_filepath", tiny_mixtral.write_checkpoint(tmp_path / "v.bin", n_embd=256),
            cwd=tmp_path)
    assert p.returncode == -6 and "n_embd value from checkpoint (256) is not equal to runtime config value (512)" \
        in p.stderr
    # a small file on a build with config.h's values: its first differing field
    ck = tiny_mixtral.write_checkpoint(tmp_path / "small.bin", weights=True, **small)
    p = run(exe, *tokens, "--llmc_filepath", ck, cwd=tmp_path)
    assert p.returncode == -6 and "block_size value from checkpoint (64) is not equal to runtime config value " \
        "(32768)" in p.stderr
    # config.h's header and no weights: the first read fails
    p = run(exe, *tokens, "--llmc_filepath", tiny_mixtral.write_checkpoint(tmp_path / "h.bin"), cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"checkpoint_loader\.cc:119\] Check failed: ifs Failed to read tensor "
                                            r"transformer\.wte\.weight$", p.stderr, re.M)
    exe = builds["support_moe_file"] / "tiny_mixtral"
    data = open(ck, "rb").read()
    cut = 1024 + 4 * (256 * 32 + 32 + 32 * 32 + 8 * 32)  # wte, ln_1, all of q and k, part of v
    (tmp_path / "short.bin").write_bytes(data[:cut])
    p = run(exe, *tokens, "--llmc_filepath", str(tmp_path / "short.bin"), cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"checkpoint_loader\.cc:135\] Check failed: ifs Failed to read tensor "
                                            r"rows transformer\.h\.0\.attn\.c_attn\.weight\.v_proj$", p.stderr, re.M)
    (tmp_path / "long.bin").write_bytes(data + b"\x07")
    p = run(exe, *tokens, "--llmc_filepath", str(tmp_path / "long.bin"), cwd=tmp_path)
    assert p.returncode == -6 and "checkpoint_loader.cc:163] Check failed: ifs.peek() == " \
        "std::ifstream::traits_type::eof() (7 vs. -1) Unexpected trailing bytes in tiny Mixtral LLMC file" in p.stderr
    p = run(exe, *tokens, "--llmc_filepath", ck, env={"STANDIN_MIXTRAL_CONFIG": "small"}, cwd=tmp_path)
    assert p.returncode == 2 and "STANDIN_MIXTRAL_CONFIG must be empty" in p.stderr
    # the weights come back in InfiniTrain's names, c_attn's q / k / v rows packed
    from tests.infinitrain_standin.glog import Logger
    got = tiny_mixtral.load_checkpoint(ck, Logger("t", {}), dict(small))
    want = tiny_mixtral.init_weights(small, seed=0)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    assert got["transformer.h.1.attn.c_attn.weight"].shape == (32 + 2 * 8, 32)


@pytest.mark.heavy
def test_tiny_mixtral_matches_hugging_face_mixtral():
    """The stand-in's tiny Mixtral (written from InfiniTrain's source) against Hugging Face's
    MixtralForCausalLM on the same weights: loss and gradients. HF's router (softmax over every
    expert, top k, renormalised) is InfiniTrain's top k then softmax; its RoPE rotates halves, so
    its q / k rows are the interleaved ones permuted (as HF's converter does)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.infinitrain_standin import mixtral_math
    c = dict(tiny_mixtral.SMALL_CONFIG, rope_theta=10000.0)
    H, KV, C, E, FF, L, V = (c[k] for k in ("n_head", "n_kv_head", "n_embd", "num_experts", "moe_ffn_hidden_size",
                                             "n_layer", "vocab_size"))
    D = C // H
    # weights 10x the init's (the router's as it is), so that attention and experts move the loss
    W = {k: v if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "router.weight")) else 10 * v
         for k, v in tiny_mixtral.init_weights(c, seed=3).items()}

    def to_hf_rows(w, n):  # interleaved pairs -> HF's rotate_half layout
        return w.reshape(n, w.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    sd = {"model.embed_tokens.weight": W["transformer.wte.weight"], "model.norm.weight": W["transformer.ln_f.weight"],
          "lm_head.weight": W["lm_head.weight"]}
    for i in range(L):
        p, q = f"transformer.h.{i}", f"model.layers.{i}"
        qkv = W[f"{p}.attn.c_attn.weight"]
        x = f"{p}.mlp.experts.expert_"
        sd |= {f"{q}.self_attn.q_proj.weight": to_hf_rows(qkv[:H * D], H),
               f"{q}.self_attn.k_proj.weight": to_hf_rows(qkv[H * D:(H + KV) * D], KV),
               f"{q}.self_attn.v_proj.weight": qkv[(H + KV) * D:],
               f"{q}.self_attn.o_proj.weight": W[f"{p}.attn.c_proj.weight"],
               f"{q}.input_layernorm.weight": W[f"{p}.ln_1.weight"],
               f"{q}.post_attention_layernorm.weight": W[f"{p}.ln_2.weight"],
               f"{q}.mlp.gate.weight": W[f"{p}.mlp.router.weight"],
               f"{q}.mlp.experts.gate_up_proj": np.stack([np.concatenate([W[f"{x}{e}.c_fc2.weight"],
                                                                          W[f"{x}{e}.c_fc.weight"]])
                                                          for e in range(E)]),
               f"{q}.mlp.experts.down_proj": np.stack([W[f"{x}{e}.c_proj.weight"] for e in range(E)])}
    hf = transformers.MixtralForCausalLM._from_config(transformers.MixtralConfig(
        vocab_size=V, hidden_size=C, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=KV, max_position_embeddings=c["block_size"], rms_norm_eps=c["norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]}, num_local_experts=E,
        num_experts_per_tok=c["router_topk"], tie_word_embeddings=False, router_jitter_noise=0.0),
        attn_implementation="eager").eval()
    hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, V, (2, 24), generator=g), torch.randint(0, V, (2, 24), generator=g)
    hf_loss = torch.nn.functional.cross_entropy(hf(input_ids=x).logits.reshape(-1, V), y.reshape(-1))
    hf_loss.backward()
    hf_grad = {n: t.grad for n, t in hf.named_parameters()}
    P = {k: torch.from_numpy(v.copy()).requires_grad_(True) for k, v in W.items()}
    ours = mixtral_math.loss(P, x, y, c)
    ours.backward()
    assert abs(ours.item() - hf_loss.item()) < 1e-5 * hf_loss.item()

    def close(a, b):
        return float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    assert close(P["transformer.wte.weight"].grad, hf_grad["model.embed_tokens.weight"])
    assert close(P["lm_head.weight"].grad, hf_grad["lm_head.weight"])
    for i in range(L):
        p, q = f"transformer.h.{i}", f"model.layers.{i}"
        assert close(to_hf_rows(P[f"{p}.attn.c_attn.weight"].grad[:H * D], H), hf_grad[f"{q}.self_attn.q_proj.weight"])
        assert close(P[f"{p}.mlp.router.weight"].grad, hf_grad[f"{q}.mlp.gate.weight"])
        for e in range(E):
            assert close(P[f"{p}.mlp.experts.expert_{e}.c_fc2.weight"].grad,
                         hf_grad[f"{q}.mlp.experts.gate_up_proj"][e, :FF])
            assert close(P[f"{p}.mlp.experts.expert_{e}.c_proj.weight"].grad, hf_grad[f"{q}.mlp.experts.down_proj"][e])
    # the planted order (softmax over every expert, then top k, not renormalised) is another model
    with torch.no_grad():
        planted = mixtral_math.loss(P, x, y, c, router_order="softmax_then_topk")
    assert abs(planted.item() - hf_loss.item()) > 1e-3


@pytest.mark.unit
def test_the_router_takes_the_top_k_logits_then_their_softmax():
    """moe_utils.cc:33-36: each token's k largest logits, softmax over those (rows sum to 1); the
    plant's order keeps the full softmax's top k (rows sum below 1), the same experts."""
    import torch
    from tests.infinitrain_standin import mixtral_math
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])  # logits (2, 0, 1, -1), (0, 1, 1, 0), ...
    dense, routed = mixtral_math.route(x, w, 2)
    assert routed.tolist() == [[True, False, True, False], [False, True, True, False], [True, False, True, False]]
    e = np.exp([2.0, 1.0])
    assert torch.allclose(dense[0], torch.tensor([e[0] / e.sum(), 0, e[1] / e.sum(), 0], dtype=torch.float32))
    assert torch.allclose(dense.sum(-1), torch.ones(3))
    planted, planted_routed = mixtral_math.route(x, w, 2, "softmax_then_topk")
    assert torch.equal(planted_routed, routed)
    full = np.exp([2.0, 0.0, 1.0, -1.0])
    assert abs(float(planted[0, 0]) - full[0] / full.sum()) < 1e-6 and float(planted[0].sum()) < 0.95


@pytest.mark.subprocess
def test_context_parallel(builds, assets, tmp_path):
    exe = builds["context_parallel"] / "gpt2"
    ref = run(exe, *common(assets), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    ref_l = {int(m.group(1)): float(m.group(2)) for m in map(CP_STEP_RE.match, ref.stderr.splitlines()) if m}
    assert len(ref_l) == 3 and CP_STEP_RE.match(ref.stderr.splitlines()[0]).group(4, 5, 6, 7, 8) == (
        "1", "1", "1", "1", "1")
    p = run(exe, *common(assets), "--nthread_per_process=8", "--context_parallel=2", "--tensor_parallel=2",
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ms = [m for m in map(CP_STEP_RE.match, p.stderr.splitlines()) if m]
    assert ms[0].group(4, 5, 6, 7, 8) == ("2", "2", "1", "2", "1")
    assert max(abs(float(m.group(2)) - ref_l[int(m.group(1))]) for m in ms) < 1e-5
    # GlobalEnv::Init's CHECK (feat/context_parallel:infini_train/src/nn/parallel/global.cc:126-127)
    p = run(exe, *common(assets), "--nthread_per_process=3", "--context_parallel=2", cwd=tmp_path)
    assert p.returncode == -6
    assert re.search(r"^F\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ global\.cc:126\] Check failed: world_size_ % "
                     r"\(tensor_parallel_size_ \* context_parallel_size_ \* pipeline_parallel_size_\) == 0 "
                     r"\(1 vs\. 0\) world_size must be divisible by TP \* CP \* PP$", p.stderr, re.M), p.stderr
    p = run(exe, *common(assets), "--zero_stage=1", cwd=tmp_path)
    assert p.returncode == -6 and "ZeRO requires DP or CP world size greater than 1." in p.stderr


@pytest.mark.subprocess
def test_activation_recompute(builds, assets, tmp_path):
    exe = builds["activation_checkpointing"] / "llama3"
    c = common(assets, "llama3")
    base = run(exe, *c, cwd=tmp_path)
    rec = run(exe, *c, "--activation_recompute", "--recompute_method=block", "--recompute_num_layers=2",
              cwd=tmp_path)
    loss = [[m.group(2) for m in map(STEP_RE.match, p.stderr.splitlines()) if m] for p in (base, rec)]
    assert len(loss[0]) == 3 and loss[0] == loss[1]
    p = run(exe, *c, "--activation_recompute", "--recompute_method=uniform", cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"transformer_config\.cc:82\] Check failed: num_layers >= 1 \(0 vs\. 1\) "
                                            r"recompute_num_layers must be >= 1", p.stderr)
    p = run(exe, *c, "--activation_recompute", "--recompute_granularity=partial", cwd=tmp_path)
    assert p.returncode == -6 and "Unknown recompute_granularity: partial. Expected none|full|selective." in p.stderr
    p = run(exe, *c, "--activation_recompute", "--recompute_granularity=selective", cwd=tmp_path)
    assert p.returncode == -6 and "transformer.cc:57] Selective activation recompute is not implemented" in p.stderr
    p = run(exe, *c, "--recompute_granularity=partial", cwd=tmp_path)  # not enabled: never parsed
    assert p.returncode == 0


@pytest.mark.unit
def test_lr_schedule_edges():
    s = lr_schedule.schedule
    f = lambda xs: [round(float(x), 9) for x in xs]
    # warmup 0, linear over num_iteration (decay 0 -> num_iteration): 1e-3 * (1 - 0.9 k / 5)
    assert f(s("linear", 1e-3, 1e-4, 0, 0.0, lr_schedule.decay_iters(0, 5), 6)) == [
        1e-3, 8.2e-4, 6.4e-4, 4.6e-4, 2.8e-4, 1e-4]
    # warmup 2 from 0: 0, max/2, then main from its step 0 (Step(0) at the milestone), last steps at min_lr
    assert f(s("linear", 1e-3, 1e-4, 2, 0.0, 5, 7)) == [0.0, 5e-4, 1e-3, 7e-4, 4e-4, 1e-4, 1e-4]
    # cosine: (min + 0.5 (cos(pi k / 3) + 1)(max - min)) after a 2-step warmup from 1e-4
    assert f(s("cosine", 1e-3, 1e-4, 2, 1e-4, 5, 7)) == [1e-4, 5.5e-4, 1e-3, 7.75e-4, 3.25e-4, 1e-4, 1e-4]
    # inverse square root, no warmup: max * sqrt(1) / sqrt(max(k, 1)) until k > decay, then min_lr
    assert f(s("inverse-square-root", 1e-3, 1e-4, 0, 0.0, 4, 6)) == [
        1e-3, 1e-3, round(float(np.float32(1e-3 / np.sqrt(2))), 9), round(float(np.float32(1e-3 / np.sqrt(3))), 9),
        5e-4, 1e-4]
    assert f(s("constant", 1e-3, 0.0, 0, 0.0, 1, 3)) == [1e-3] * 3
    assert f(s("none", 1e-3, 0.0, 5, 0.0, 1, 2)) == [1e-3] * 2
    # decay iters fewer than (or equal to) warmup: CreateLRScheduler's CHECK_LT
    bad = lr_schedule.check("linear", 1e-3, 0.0, 5, 0.0, 3)
    assert bad[0] == "config.lr_warmup_iters < config.lr_decay_iters" and bad[1:3] == ("5", "3")
    assert lr_schedule.check("cosine", 1e-3, 2e-3, 0, 0.0, 3)[3] == "CreateLRScheduler: max_lr must be >= min_lr."
    assert lr_schedule.check("none", 1e-3, 2e-3, 5, 0.0, 3) is None


@pytest.mark.unit
def test_lr_schedule_plants():
    s = lr_schedule.schedule
    f = lambda xs: [round(float(x), 9) for x in xs]
    # warmup_short: the hand-over one step early, the ramp still k / W: step W (1-based) is max
    assert f(s("linear", 1e-3, 1e-4, 2, 0.0, 5, 7)) == [0.0, 5e-4, 1e-3, 7e-4, 4e-4, 1e-4, 1e-4]
    assert f(s("linear", 1e-3, 1e-4, 2, 0.0, 5, 7, plant="warmup_short")) == [
        0.0, 1e-3, 7e-4, 4e-4, 1e-4, 1e-4, 1e-4]
    four = f(s("cosine", 1e-3, 1e-4, 4, 0.0, 8, 6))
    short = f(s("cosine", 1e-3, 1e-4, 4, 0.0, 8, 6, plant="warmup_short"))
    assert four[:3] == short[:3] == [0.0, 2.5e-4, 5e-4] and four[3] == 7.5e-4 and short[3] == 1e-3
    assert short[4:] == four[5:] + [round(float(np.float32(1e-4 + 0.9e-3 * 0.5 * (np.cos(np.pi * 2 / 4) + 1))), 9)]
    # W = 1: no warmup left at all; W = 0: nothing to shorten
    assert f(s("constant", 1e-3, 0.0, 1, 0.0, 3, 3, plant="warmup_short")) == [1e-3] * 3
    assert f(s("cosine", 1e-3, 1e-4, 0, 0.0, 3, 4, plant="warmup_short")) == f(s("cosine", 1e-3, 1e-4, 0, 0.0, 3, 4))
    # cosine_floor: the cosine ends at 2 x min_lr, and the planted lr is never below the branch's
    cos = f(s("cosine", 1e-3, 1e-4, 2, 1e-4, 5, 7))
    floor = f(s("cosine", 1e-3, 1e-4, 2, 1e-4, 5, 7, plant="cosine_floor"))
    assert cos == [1e-4, 5.5e-4, 1e-3, 7.75e-4, 3.25e-4, 1e-4, 1e-4]
    assert floor[:3] == cos[:3] and floor[3:] == [8e-4, 4e-4, 2e-4, 2e-4]
    # other styles have no cosine to plant
    assert f(s("linear", 1e-3, 1e-4, 2, 0.0, 5, 7, plant="cosine_floor")) == f(s("linear", 1e-3, 1e-4, 2, 0.0, 5, 7))
    with pytest.raises(ValueError, match="lr plant 'cosine'"):
        s("cosine", 1e-3, 1e-4, 2, 0.0, 5, 7, plant="cosine")


@pytest.mark.subprocess
def test_lr_scheduler_run(builds, assets, tmp_path):
    exe = builds["lr_scheduler"] / "gpt2"
    p = run(exe, *common(assets), "--lr_decay_style=linear", "--min_lr=1e-4", "--lr_warmup_iters=1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert [m.group(3) for m in map(STEP_RE.match, p.stderr.splitlines()) if m] == ["0.00e+00", "1.00e-03",
                                                                                     "5.50e-04"]
    # the SGD update uses the scheduled lr: lr 0 at the first step leaves the weights as they
    # were, so the constant-lr run's second loss differs and its first is the same
    loss = [m.group(2) for m in map(STEP_RE.match, p.stderr.splitlines()) if m]
    const = run(exe, *common(assets), "--save=ckc", cwd=tmp_path)
    loss_c = [m.group(2) for m in map(STEP_RE.match, const.stderr.splitlines()) if m]
    assert loss[0] == loss_c[0] and loss[1] != loss_c[1]
    none = run(exe, *common(assets), "--lr_decay_style=none", "--save=ckn", cwd=tmp_path)
    assert [m.group(2) for m in map(STEP_RE.match, none.stderr.splitlines()) if m] == loss_c
    assert (tmp_path / "checkpoints" / "checkpoint_final" / "trainer_state.json").is_file()
    p = run(exe, *common(assets), "--lr_decay_style=linear", "--lr_warmup_iters=3", cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"lr_scheduler\.cc:29\] Check failed: config\.lr_warmup_iters < "
                                            r"config\.lr_decay_iters \(3 vs\. 3\) CreateLRScheduler", p.stderr)
    # STANDIN_PLANT_LR: the printed lr and the update follow the planted schedule
    planted = run(exe, *common(assets), "--lr_decay_style=linear", "--min_lr=1e-4", "--lr_warmup_iters=2",
                  "--save=ckp", env={"STANDIN_PLANT_LR": "warmup_short"}, cwd=tmp_path)
    assert [m.group(3) for m in map(STEP_RE.match, planted.stderr.splitlines()) if m] == [
        "0.00e+00", "1.00e-03", "1.00e-04"]
    p = run(exe, *common(assets), env={"STANDIN_PLANT_LR": "short"}, cwd=tmp_path)
    assert p.returncode == 2 and "STANDIN_PLANT_LR must be one of warmup_short, cosine_floor (got 'short')" in p.stderr


# feat/add_Qwen3-8B:example/qwen3/main.cc:42-86: the 29 names the real CPU build's `./qwen3 --helpxml`
# lists under example/qwen3/main.cc (measured on a3f84f8, docs/infinitrain_branches.md)
QWEN3 = {"batch_size", "device", "dtype", "freq_generate_txt", "input_bin", "input_val_bin", "learning_rate",
         "llmc_filepath", "lora_alpha", "lora_load_path", "lora_rank", "lora_save_path", "lora_target_modules",
         "model", "nthread_per_process", "num_iteration", "overfit_single_batch", "pipeline_parallel",
         "precision_check", "sample_every", "sequence_length", "sequence_parallel", "tensor_parallel",
         "text_length", "tokenizer_bin", "total_batch_size", "use_distributed_optimizer", "val_loss_every",
         "virtual_pipeline_parallel"}


@pytest.mark.subprocess
def test_qwen3_program_its_flags_its_header_checks_and_its_step_line(builds, assets, tmp_path):
    """The stand-in's qwen3: the real listing's flags, the loader's magic / version CHECKs in glog's
    words (what the backend's loader hint reads), and glog step lines of the Adam (0.9, 0.95) run
    on the harness's `infinitrain` qwen3 file. Its losses are the real binary's to 1e-6 on that file
    (a3f84f8 CPU build: 5.558524, 5.562173, 5.562376; the stand-in 5.558523, 5.562172, 5.562377)."""
    qwen3 = builds["qwen3"] / "qwen3"
    assert sorted(x.name for x in builds["qwen3"].iterdir() if x.is_file()) == [
        "gpt2", "infini_run", "llama3", "qwen3"]
    p = run(qwen3, "--helpxml", cwd=tmp_path)
    got = FLAG_RE.findall(p.stdout)
    assert p.returncode == 1 and {n for f, n in got if f == "example/qwen3/main.cc"} == QWEN3
    assert len(got) == len(QWEN3) + len(GFLAGS_OWN)
    p = run(qwen3, "--model=qwen2", cwd=tmp_path)
    assert p.returncode == 1 and "failed validation of new value 'qwen2' for flag 'model'" in p.stderr
    files = ["--input_bin", str(assets.tokens("qwen3", "train")), "--device", "cpu", "--num_iteration", "3"]
    wrong = tmp_path / "llama3.bin"
    wrong.write_bytes(assets.checkpoint("llama3").read_bytes())
    p = run(qwen3, "--llmc_filepath", str(wrong), *files, cwd=tmp_path)
    assert p.returncode == -6 and re.search(
        r"^F\d{8} .*checkpoint_loader\.cc:53\] Check failed: magic == kQwen3Magic \(20240803 vs\. 20240804\)",
        p.stderr, re.M), p.stderr[-2000:]
    p = run(qwen3, "--llmc_filepath", str(assets.checkpoint("qwen3")), *files, cwd=tmp_path)
    losses = [float(m.group(2)) for m in map(STEP_RE.match, p.stderr.splitlines()) if m]
    assert p.returncode == 0 and len(losses) == 3, p.stderr[-2000:]
    assert losses == pytest.approx([5.558524, 5.562173, 5.562376], abs=2e-6)
    assert "peak used:     0 MB | peak reserved:     0 MB, DP=1, TP=1, SP=1, PP=1)" in p.stderr
    # one device only: a CUDA stand-in build says so (the CPU build aborts as the real one)
    p = run(qwen3, "--llmc_filepath", str(assets.checkpoint("qwen3")), *files, "--nthread_per_process", "2",
            cwd=tmp_path)
    assert p.returncode == 2 and "plays one device only" in p.stderr


@pytest.mark.subprocess
def test_mixtral_is_tiny_mixtral_renamed_with_peak_memory_on_its_step_line(builds, assets, tmp_path):
    build = make_build_dir(tmp_path / "b", flavour="support_moe", mixtral_config="file",
                           models=("gpt2", "llama3", "mixtral"))
    assert not (build / "tiny_mixtral").exists()
    p = run(build / "mixtral", "--helpxml", cwd=tmp_path)
    got = FLAG_RE.findall(p.stdout)
    assert {n for f, n in got if f == "example/tiny_mixtral/main.cc"} == TINY_MIXTRAL
    assert "<program>mixtral</program>" in p.stdout
    ck = tiny_mixtral.write_checkpoint(tmp_path / "mixtral.bin", weights=True, **tiny_mixtral.SMALL_CONFIG)
    args = ["--llmc_filepath", str(ck), "--input_bin", str(assets.tokens("llama3", "train")), "--num_iteration", "2"]
    renamed = run(build / "mixtral", *args, cwd=tmp_path)
    old = run(builds["support_moe_file"] / "tiny_mixtral", *args, cwd=tmp_path)
    steps = [line for line in renamed.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 2 and all(line.endswith("| peak used:     0 MB | peak reserved:     0 MB)")
                                   for line in steps), renamed.stdout
    # the same mathematics under the new name
    assert [line.split("|")[1] for line in steps] == [
        line.split("|")[1] for line in old.stdout.splitlines() if line.startswith("step")]
