"""Tests of the InfiniTrain stand-in (each run is a subprocess of the built scripts)."""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.trainer import save_npy

STEP_RE = re.compile(r"^E\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ main\.cc:\d+\] step +(\d+)/(\d+) \| train loss "
                     r"(\d+\.\d{6}) \| lr \d\.\d\de[-+]\d\d \| \(\d+\.\d\d ms \| \d+ tok/s \| peak used: +\d+ MB"
                     r" \| peak reserved: +\d+ MB, DP=(\d+), TP=(\d+), SP=(\d+), PP=(\d+)\)$")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from harness.assets import ensure_assets
    a = ensure_assets("infinitrain")  # what master's loaders accept
    build = make_build_dir(tmp_path_factory.mktemp("build"))
    return a, build


def run(env, tmp_path, prog, *args, model="gpt2", extra_env=None, cwd=None, common=True):
    a, build = env
    cmd = [str(build / prog)]
    if prog == "infini_run":
        cmd += list(args[0]) + ["--", str(build / model)]
        args = args[1:]
    if common:
        cmd += ["--llmc_filepath", str(a.checkpoint(model)), "--input_bin", str(a.tokens(model, "train")),
                "--device", "cuda", "--learning_rate", "1e-3", "--total_batch_size", "1024",
                "--num_iteration", "3"]
    cmd += list(args)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "STANDIN_", "PROC_", "GLOBAL_PROC"))}
    e.update(extra_env or {})
    wd = cwd or tmp_path / "work"
    wd.mkdir(exist_ok=True)
    return subprocess.run(cmd, cwd=wd, env=e, capture_output=True, text=True, timeout=60)


def losses(p):
    out = {}
    for line in p.stderr.splitlines():
        m = STEP_RE.match(line)
        if m:
            out[int(m.group(1))] = float(m.group(3))
    return out


def test_unknown_flags_and_undefok(env, tmp_path):
    p = run(env, tmp_path, "gpt2", "--optimizer=adamw")
    assert p.returncode == 1 and "ERROR: unknown command line flag 'optimizer'" in p.stderr
    p = run(env, tmp_path, "llama3", "--dump_gradients=x", model="llama3")
    assert p.returncode == 1 and "ERROR: unknown command line flag 'dump_gradients'" in p.stderr
    p = run(env, tmp_path, "gpt2", "--zero_stage=5")
    assert p.returncode == 1 and "failed validation" in p.stderr
    p = run(env, tmp_path, "gpt2", "--seed", "1", "--undefok=seed", "--num_iteration=1", "-nosequence_parallel")
    assert p.returncode == 0, p.stderr
    assert list(losses(p)) == [1]


def test_step_lines_glog_and_fatal(env, tmp_path):
    p = run(env, tmp_path, "gpt2")  # default glog: only ERROR+ on stderr
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 3 and all(STEP_RE.match(l) for l in lines), lines
    loss = losses(p)
    assert loss[3] < loss[1]
    p = run(env, tmp_path, "gpt2", "--num_iteration=1",
            extra_env={"GLOG_logtostderr": "1", "CUDA_VISIBLE_DEVICES": "0"})
    assert "CUDA_VISIBLE_DEVICES=0" in p.stderr and p.stderr.startswith("I")
    p = run(env, tmp_path, "gpt2", "--num_iteration=1",
            extra_env={"GLOG_logtostdout": "1", "GLOG_log_dir": str(tmp_path / "logs")})
    assert p.stderr == "" and len(losses(type("P", (), {"stderr": p.stdout}))) == 1
    p = run(env, tmp_path, "gpt2", "--num_iteration=1", extra_env={"GLOG_log_dir": str(tmp_path / "logs")})
    (f,) = [x for x in (tmp_path / "logs").iterdir() if ".log.INFO." in x.name]
    assert f.name.startswith("gpt2.") and "step    1/1" in f.read_text()  # flushed at exit
    p = run(env, tmp_path, "gpt2", "--total_batch_size=1000")
    assert p.returncode == -6 and re.search(r"^F\d{8} .*Check failed: FLAGS_total_batch_size", p.stderr, re.M)
    p = run(env, tmp_path, "gpt2", "--save=x")
    assert p.returncode == -6 and "save_interval is 0" in p.stderr
    p = run(env, tmp_path, "gpt2", "--llmc_filepath=/nonexistent.bin")
    assert p.returncode == -6 and "/nonexistent.bin" in p.stderr


def test_parallel_close_not_identical_and_dumps(env, tmp_path):
    ref = run(env, tmp_path, "gpt2", f"--dump_gradients={tmp_path / 'ref'}")
    par = {}
    for tag, args in {"pp": ["--pipeline_parallel=2", "--pipeline_layer_partition=2,6"],
                      "tp": ["--tensor_parallel=2", "--pipeline_parallel=2"],
                      "dp": ["--zero_stage=1"]}.items():
        p = run(env, tmp_path, "gpt2", "--nthread_per_process=4", *args, f"--dump_gradients={tmp_path / tag}")
        assert p.returncode == 0, p.stderr
        par[tag] = p
        assert losses(p).keys() == losses(ref).keys()
        assert max(abs(losses(p)[k] - losses(ref)[k]) for k in losses(ref)) < 1e-5
    names = sorted(os.listdir(tmp_path / "ref"))
    assert len(names) == 8 * 12 + 5 and "transformer.h.7.mlp.c_proj.bias.npy" in names
    for tag in par:
        assert sorted(os.listdir(tmp_path / tag)) == names
    g_ref = {n: np.load(tmp_path / "ref" / n) for n in names}
    for tag in ("pp", "dp"):
        g = {n: np.load(tmp_path / tag / n) for n in names}
        assert all(np.allclose(g[n], g_ref[n], atol=1e-6, rtol=1e-3) for n in names)
        assert any(not np.array_equal(g[n], g_ref[n]) for n in names), tag
    tp = tmp_path / "tp"
    C, V = 48, 256
    assert np.load(tp / "transformer.h.0.attn.c_attn.weight.npy").shape == (3 * C // 2, C)
    assert np.load(tp / "transformer.h.0.attn.c_proj.weight.npy").shape == (C, C // 2)
    assert np.load(tp / "transformer.h.0.attn.c_proj.bias.npy").shape == (C,)
    assert np.load(tp / "transformer.h.0.mlp.c_fc.bias.npy").shape == (4 * C // 2,)
    assert np.load(tp / "transformer.h.0.mlp.c_proj.weight.npy").shape == (C, 4 * C // 2)
    assert np.load(tp / "lm_head.weight.npy").shape == (320 // 2, C)
    assert g_ref["transformer.wte.weight.npy"].shape == (V, C)
    # bytes exactly as Tensor::SaveAsNpy
    raw = (tmp_path / "ref" / "transformer.ln_f.bias.npy").read_bytes()
    hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (48,) }"
    pad = 16 - ((10 + len(hdr) + 1) % 16)  # SaveAsNpy's padding (16 when already aligned)
    n = len(hdr) + pad + 1
    assert raw[:10] == b"\x93NUMPY\x01\x00" + n.to_bytes(2, "little")
    assert raw[10:10 + n] == hdr + b" " * pad + b"\n" and len(raw) == 10 + n + 48 * 4
    save_npy(tmp_path / "x.npy", np.zeros((3, 5), np.float32))
    assert np.load(tmp_path / "x.npy").shape == (3, 5)


def test_bf16_and_lora_move(env, tmp_path):
    f32 = losses(run(env, tmp_path, "gpt2"))
    bf = losses(run(env, tmp_path, "gpt2", "--dtype=bfloat16"))
    lora = run(env, tmp_path, "llama3", "--lora_rank=4", model="llama3")
    base = run(env, tmp_path, "llama3", model="llama3")
    assert 1e-5 < abs(bf[3] - f32[3]) < 1e-1
    assert losses(lora)[1] == losses(base)[1] and losses(lora)[3] != losses(base)[3]
    p = run(env, tmp_path, "gpt2", "--lora_rank=2", "--num_iteration=1", f"--dump_gradients={tmp_path / 'l'}")
    assert sorted(os.listdir(tmp_path / "l"))[:2] == ["transformer.h.0.attn.c_attn.lora_A.npy",
                                                       "transformer.h.0.attn.c_attn.lora_B.npy"]
    assert len(os.listdir(tmp_path / "l")) == 8 * 3 * 2  # c_attn, attn.c_proj, mlp.c_proj


def test_infini_run_crash_and_plant(env, tmp_path):
    p = run(env, tmp_path, "infini_run", ["--nproc_per_node=2"], extra_env={"STANDIN_CRASH_RANK": "0"})
    assert p.returncode == 0
    assert re.search(r"^F\d{8} .*Check failed: planted crash on rank 0", p.stderr, re.M)
    assert len(losses(p)) == 3  # the other child (last rank) still finished
    plant = {"STANDIN_PLANT": "transformer.h.5.mlp.c_fc.weight:1e-3"}
    run(env, tmp_path, "gpt2", "--num_iteration=1", f"--dump_gradients={tmp_path / 'r'}", extra_env=plant)
    (tmp_path / "w2").mkdir()  # the aborted rank 0 left its cclUniqueId file in work/, as a real one would
    run(env, tmp_path, "infini_run", ["--nproc_per_node=2"], "--num_iteration=1",
        f"--dump_gradients={tmp_path / 'p'}", extra_env=plant, cwd=tmp_path / "w2")
    n = "transformer.h.5.mlp.c_fc.weight.npy"
    r, q = np.load(tmp_path / "r" / n), np.load(tmp_path / "p" / n)
    ratio = np.linalg.norm(q) / np.linalg.norm(r)
    assert abs(ratio - 1.001) < 1e-5
    o = "transformer.h.5.mlp.c_fc.bias.npy"
    assert np.allclose(np.load(tmp_path / "r" / o), np.load(tmp_path / "p" / o), rtol=1e-4, atol=1e-7)
    # without "--" gflags in the launcher eats the trainer's flags, as the real one does
    a, build = env
    p = subprocess.run([str(build / "infini_run"), "--nproc_per_node=2", str(build / "gpt2"), "--batch_size=4"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and "unknown command line flag 'batch_size'" in p.stderr


def test_resume_equals_uninterrupted(env, tmp_path):
    full = run(env, tmp_path, "gpt2", "--num_iteration=4", "--nthread_per_process=2")
    ck = tmp_path / "ck"
    first = run(env, tmp_path, "gpt2", "--num_iteration=4", "--nthread_per_process=2", f"--save={ck}",
                "--save_interval=2", "--max_checkpoint_keep=1")
    assert sorted(os.listdir(ck)) == ["checkpoint_step_000004"]
    ck2 = tmp_path / "ck2"
    run(env, tmp_path, "gpt2", "--num_iteration=2", "--nthread_per_process=2", f"--save={ck2}", "--save_interval=2")
    st = ck2 / "checkpoint_step_000002" / "rank_000001" / "trainer_state.json"
    assert '"global_step": 2,' in st.read_text()
    res = run(env, tmp_path, "gpt2", "--num_iteration=4", "--nthread_per_process=2",
              f"--load={ck2 / 'checkpoint_step_000002'}")
    assert sorted(losses(res)) == [3, 4], res.stderr
    assert all(abs(losses(res)[k] - losses(full)[k]) <= 1e-6 for k in (3, 4))
    assert losses(first) == losses(full)
    p = run(env, tmp_path, "gpt2", f"--load={tmp_path / 'missing'}")
    assert p.returncode == -6 and str(tmp_path / "missing") in p.stderr


def test_ccl_unique_id_collision(env, tmp_path):
    wd = tmp_path / "shared"
    wd.mkdir()
    (wd / "cclUniqueId_DP0.bin").write_bytes(b"x")
    p = run(env, tmp_path, "gpt2", "--nthread_per_process=2", cwd=wd)
    assert p.returncode == -6 and "cclUniqueId_DP0.bin" in p.stderr and "exists" in p.stderr
    (wd / "cclUniqueId_DP0.bin").unlink()
    p = run(env, tmp_path, "gpt2", "--nthread_per_process=2", "--num_iteration=1", cwd=wd)
    assert p.returncode == 0 and os.listdir(wd) == []
