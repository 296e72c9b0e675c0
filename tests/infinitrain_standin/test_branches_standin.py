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
        "support_moe_cpu": make_build_dir(root / "moe_cpu", flavour="support_moe", cuda=False)}


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


@pytest.mark.subprocess
def test_tiny_mixtral(builds, assets, tmp_path):
    ck = tiny_mixtral.write_checkpoint(tmp_path / "mixtral.bin")
    exe = builds["support_moe"] / "tiny_mixtral"
    args = ["--llmc_filepath", ck, "--input_bin", str(assets.tokens("llama3", "train"))]
    p = run(exe, *args, "--global_batch_size=80", "--micro_batch_size=80", cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 11 and all(MIXTRAL_STEP_RE.match(l) for l in lines[:10]), lines
    assert re.fullmatch(r"final 9 iters avg: \d+\.\d{3}ms", lines[10])
    loss = [float(MIXTRAL_STEP_RE.match(l).group(3)) for l in lines[:10]]
    assert 11 < loss[0] < 12.5 and loss[-1] < loss[0]
    again = run(exe, *args, "--global_batch_size=80", "--micro_batch_size=80", cwd=tmp_path)
    assert [l.split("(")[0] for l in again.stdout.splitlines()[:10]] == [l.split("(")[0] for l in lines[:10]]
    # accumulation: 80 = 20 x 4 gives the same first-step loss within float noise
    ga = run(exe, *args, "--global_batch_size=80", "--micro_batch_size=20", "--num_iteration=1", cwd=tmp_path)
    assert abs(float(MIXTRAL_STEP_RE.match(ga.stdout.splitlines()[0]).group(3)) - loss[0]) < 1e-4
    # its checks
    p = run(exe, *args, "--global_batch_size=10", "--micro_batch_size=4", cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"^F\d{8} .*main\.cc:49\] Check failed: FLAGS_global_batch_size % "
                                            r"FLAGS_micro_batch_size == 0 \(2 vs\. 0\) global_batch_size must be "
                                            r"divisible by micro_batch_size", p.stderr, re.M)
    p = run(exe, *args, "--nthread_per_process=2", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr == "ERROR: unknown command line flag 'nthread_per_process'\n"
    p = run(exe, "--input_bin", args[3], "--llmc_filepath", tiny_mixtral.write_checkpoint(tmp_path / "bad.bin",
                                                                                           magic=20240803),
            cwd=tmp_path)
    assert p.returncode == -6 and re.search(r"^F\d{8} .*checkpoint_loader\.cc:45\] Check failed: .*== "
                                            r"kTinyMixtralLLMCMagic \(20240803 vs\. 20260513\)", p.stderr, re.M)
    p = run(exe, "--input_bin", args[3], "--llmc_filepath",
            tiny_mixtral.write_checkpoint(tmp_path / "v.bin", n_embd=256), cwd=tmp_path)
    assert p.returncode == -6 and "n_embd value from checkpoint (256) is not equal to runtime config value (512)" \
        in p.stderr
    p = run(exe, *args, "--device=cuda", "--num_iteration=1", cwd=tmp_path)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 2
    p = run(builds["support_moe_cpu"] / "tiny_mixtral", *args, "--device=cuda", cwd=tmp_path)
    assert p.returncode == -6 and "device_guard.cc:161" in p.stderr
    p = run(exe, *args, "--log_interval=4", cwd=tmp_path)
    assert [l.split("|")[0].strip() for l in p.stdout.splitlines()[:-1]] == ["step    4/10", "step    8/10",
                                                                               "step   10/10"]


@pytest.mark.unit
def test_tiny_mixtral_gradients():
    rng = np.random.default_rng(1)
    P = {k: v.astype(np.float64) for k, v in tiny_mixtral.init_params(b"seed").items()}
    x, y = rng.integers(0, 128256, 40), rng.integers(0, 128256, 40)
    _, g = tiny_mixtral.forward_backward(P, x, y, 1.0)
    for k in P:
        idx = (int(x[0] % 256), 3) if k == "wte" else tuple(int(rng.integers(0, s)) for s in P[k].shape)
        old = P[k][idx]
        P[k][idx] = old + 1e-3
        lp, _ = tiny_mixtral.forward_backward(P, x, y, 1.0)
        P[k][idx] = old - 1e-3
        lm, _ = tiny_mixtral.forward_backward(P, x, y, 1.0)
        P[k][idx] = old
        assert abs((float(lp) - float(lm)) / 2e-3 - float(g[k][idx])) < 2e-3 * max(1.0, abs(float(g[k][idx])) * 100), k


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
