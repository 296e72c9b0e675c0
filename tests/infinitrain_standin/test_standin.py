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


# ---------------------------------------------------------------------------------------------
# builds, flags, loader checks, CPU builds, dumps, plants, crashes, speed

FLAG_RE = re.compile(r"<flag><file>([^<]*)</file><name>([^<]*)</name><meaning>([^<]*)</meaning>"
                     r"<default>([^<]*)</default><current>([^<]*)</current><type>([^<]*)</type></flag>")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("builds")
    return {(fl, cu): make_build_dir(root / f"{fl}-{'cuda' if cu else 'cpu'}", flavour=fl, cuda=cu)
            for fl in ("master", "pr209") for cu in (True, False)}


def plain(build, prog, *args, extra_env=None, cwd=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "STANDIN_", "PROC_", "GLOBAL_PROC"))}
    e.update(extra_env or {})
    return subprocess.run([str(build / prog), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd or build, env=e)


def test_helpxml_and_helpfull(builds):
    p = plain(builds["master", True], "gpt2", "--helpxml", "--batch_size=8", "--bogus")
    assert p.returncode == 1 and p.stderr == ""  # help is handled before errors are reported
    out = p.stdout
    assert out.startswith('<?xml version="1.0"?>\n<AllFlags>\n<program>gpt2</program>\n'
                          "<usage>Warning: SetUsageMessage() never called</usage>\n") and out.endswith("</AllFlags>\n")
    flags = FLAG_RE.findall(out)
    assert len(flags) == out.count("<flag>") == 48  # 34 of main.cc + 14 of gflags
    assert ("example/gpt2/main.cc", "lora_rank", "LoRA rank (0 = disabled)", "0", "0", "int32") in flags
    assert ("example/gpt2/main.cc", "batch_size", "batch size, in units of #batch dimensions", "4", "8",
            "uint32") in flags
    assert ("example/gpt2/main.cc", "learning_rate", "learning rate warmup iterations", "0.0001", "0.0001",
            "double") in flags
    files = {f[0] for f in flags}
    assert files == {"example/gpt2/main.cc", "src/gflags.cc", "src/gflags_completions.cc", "src/gflags_reporting.cc"}
    names = [f[1] for f in flags]
    assert names[:1] == ["batch_size"] and {"helpxml", "undefok", "tab_completion_word", "version"} <= set(names)
    assert not {"logtostderr", "log_dir", "v", "dump_gradients", "pipeline_layer_partition"} & set(names)
    assert [(f[0], f[1]) for f in flags] == sorted((f[0], f[1]) for f in flags)
    p = plain(builds["master", True], "llama3", "--helpxml")
    assert len(FLAG_RE.findall(p.stdout)) == 48
    assert len(FLAG_RE.findall(plain(builds["pr209", True], "gpt2", "--helpxml").stdout)) == 53
    assert len(FLAG_RE.findall(plain(builds["pr209", True], "llama3", "--helpxml").stdout)) == 52
    p = plain(builds["pr209", True], "gpt2", "--helpfull")
    assert p.returncode == 1 and p.stdout.startswith("gpt2: Warning: SetUsageMessage() never called\n")
    assert "\n  Flags from example/gpt2/main.cc:\n    -batch_size (batch size, in units of #batch dimensions)" in p.stdout
    assert '-dump_gradients (' in p.stdout and "\n\n\n  Flags from src/gflags.cc:\n" in p.stdout
    assert all(len(l) < 80 or " " not in l.strip() for l in p.stdout.splitlines())
    p = plain(builds["pr209", True], "gpt2", "--logtostderr")  # glog is built WITH_GFLAGS=OFF
    assert p.returncode == 1 and p.stderr == "ERROR: unknown command line flag 'logtostderr'\n"
    p = plain(builds["pr209", True], "infini_run", "--helpxml")
    assert p.returncode == 1 and "<name>nproc_per_node</name><meaning>Number of processes per node" in p.stdout
    from tests.infinitrain_standin import gflags
    xml = gflags.xml_listing("a&b", {"x": gflags.Flag("x", "string", "<a & b>", None, "1 < 2 & 3 > 2", "f.cc")})
    assert "<program>a&amp;b</program>" in xml and "<meaning>1 &lt; 2 &amp; 3 > 2</meaning>" in xml
    assert "<default>&lt;a &amp; b></default>" in xml


def test_build_flavours_and_cuda_markers(builds, tmp_path, env):
    a, _ = env
    for (fl, cu), b in builds.items():
        for prog in ("gpt2", "llama3"):
            data = (b / prog).read_bytes()
            assert any(m in data for m in (b"libcudart", b"libnccl", b"libcublas")) == cu
            if cu:
                assert b"libcudart.so libnccl.so" in data
        assert not any(m in (b / "infini_run").read_bytes() for m in (b"libcudart", b"libnccl", b"libcublas"))
    only = make_build_dir(tmp_path / "only", models=("llama3",))
    assert (only / "llama3").exists() and not (only / "gpt2").exists()
    common = ["--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin", str(a.tokens("gpt2", "train")),
              "--num_iteration=1", "--total_batch_size=256"]
    p = plain(builds["master", True], "gpt2", *common, f"--dump_gradients={tmp_path / 'd'}")
    assert p.returncode == 1 and "unknown command line flag 'dump_gradients'" in p.stderr
    p = plain(builds["master", True], "gpt2", *common, "--pipeline_layer_partition=4,4")
    assert p.returncode == 1 and "unknown command line flag 'pipeline_layer_partition'" in p.stderr
    p = plain(builds["pr209", True], "gpt2", *common, f"--dump_gradients={tmp_path / 'd'}")
    assert p.returncode == 0 and len(os.listdir(tmp_path / "d")) == 8 * 12 + 5


DG = re.compile(r"^F\d{8} \d\d:\d\d:\d\d\.\d{6} +\d+ device_guard\.cc:161\] No DeviceGuardImpl registered for type 1$",
                re.M)


def test_cpu_build_fails_like_the_real_one(builds, env, tmp_path):
    a, _ = env
    cpu = builds["pr209", False]
    common = ["--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin", str(a.tokens("gpt2", "train")),
              "--num_iteration=1", "--total_batch_size=512"]
    for extra in (["--nthread_per_process=2"], ["--nthread_per_process=2", "--tensor_parallel=2"],
                  ["--nthread_per_process=2", "--pipeline_parallel=2", "--device=cpu"]):
        p = plain(cpu, "gpt2", *common, *extra)
        assert p.returncode == -6 and DG.search(p.stderr), (extra, p.stderr)
    sh = subprocess.run(["sh", "-c", " ".join([str(cpu / "gpt2"), *common, "--nthread_per_process=2"])],
                        capture_output=True, text=True)
    assert sh.returncode == 134 or sh.returncode == -6  # the shell's view: 128 + SIGABRT
    p = plain(cpu, "gpt2", *common, "--tensor_parallel=2")
    assert p.returncode == -8 and p.stderr == ""  # SIGFPE
    p = plain(cpu, "infini_run", "--nproc_per_node=2", "--", str(cpu / "gpt2"), *common, cwd=tmp_path)
    assert os.listdir(tmp_path) == []  # a CPU build dies before it makes any cclUniqueId file
    assert p.returncode == 0 and len(DG.findall(p.stderr)) == 2
    p = plain(cpu, "gpt2", *common)  # --device defaults to cuda
    assert p.returncode == -6 and DG.search(p.stderr)
    p = plain(cpu, "gpt2", *common, "--device=cpu")
    assert p.returncode == 0 and len(losses(p)) == 1
    p = plain(builds["pr209", True], "gpt2", *common, "--tensor_parallel=2")
    assert p.returncode == -8 and p.stderr == ""  # world 1 < TP 2: SIGFPE in any build


def test_loader_checks(builds, env, tmp_path):
    from harness.assets import ensure_assets
    a, _ = env
    tiny = ensure_assets("tiny")  # GPT-2 with 4 heads, LLaMA 3 with vocabulary 256
    b = builds["pr209", True]
    for fl in ("master", "pr209"):
        p = plain(builds[fl, True], "gpt2", "--llmc_filepath", str(tiny.checkpoint("gpt2")),
                  "--input_bin", str(tiny.tokens("gpt2", "train")))
        assert p.returncode == -6
        assert re.search(r"^F\d{8} [\d:.]+ +\d+ config\.h:36\] Check failed: c\.n_kv_head == c\.n_head \(12 vs\. 4\) "
                         r"GPT-2 does not use GQA; n_kv_head must equal n_head$", p.stderr, re.M), p.stderr
        p = plain(builds[fl, True], "llama3", "--llmc_filepath", str(tiny.checkpoint("llama3")),
                  "--input_bin", str(tiny.tokens("llama3", "train")))
        assert p.returncode == -6
        assert re.search(r"^F\d{8} [\d:.]+ +\d+ config\.h:31\] Check failed: c\.vocab_size >= c\.original_vocab_size "
                         r"\(256 vs\. 128256\) $", p.stderr, re.M), p.stderr
    lcommon = ["--llmc_filepath", str(a.checkpoint("llama3")), "--input_bin", str(a.tokens("llama3", "train")),
               "--num_iteration=1", "--total_batch_size=256"]
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()  # an aborted run leaves its cclUniqueId files behind, as a real one does
    p = plain(b, "llama3", *lcommon, "--nthread_per_process=8", "--tensor_parallel=8", cwd=tmp_path / "w1")
    assert p.returncode == -6 and "causal_self_attention.cc:57] Check failed: config.n_head % tp_world_size == 0 " \
        "(4 vs. 0) n_head must be divisible by TP world size" in p.stderr
    # a GPT-2 file with 8 heads of width 6... n_head must be 12; n_embd % n_head (config.h:35)
    raw = bytearray(a.checkpoint("gpt2").read_bytes())
    hdr = np.frombuffer(raw[:1024], np.int32).copy()
    hdr[6] = 50  # n_embd 50: 50 % 12 = 2
    bad = tmp_path / "bad.bin"
    bad.write_bytes(hdr.tobytes() + raw[1024:])
    p = plain(b, "gpt2", "--llmc_filepath", str(bad), "--input_bin", str(a.tokens("gpt2", "train")))
    assert p.returncode == -6 and "config.h:35] Check failed: c.n_embd % c.n_head == 0 (2 vs. 0) n_embd must be " \
        "divisible by n_head" in p.stderr
    hdr[6], hdr[1] = 48, 7
    bad.write_bytes(hdr.tobytes() + raw[1024:])
    p = plain(b, "gpt2", "--llmc_filepath", str(bad), "--input_bin", str(a.tokens("gpt2", "train")))
    assert p.returncode == -6 and "checkpoint_loader.cc:52] Unsupported version: 7" in p.stderr
    # gpt2 master with TP: the loss takes GPT2Config()'s 50257, above the padded 320
    p = plain(builds["master", True], "gpt2", "--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin",
              str(a.tokens("gpt2", "train")), "--nthread_per_process=2", "--tensor_parallel=2", cwd=tmp_path / "w2")
    assert p.returncode == -6 and "tensor_parallel.cc:463] Check failed: vocab_size_original_ <= " \
        "vocab_size_global_ (50257 vs. 320)" in p.stderr


def test_llama3_128256_vocab_speed(env, tmp_path):
    import time
    a, build = env
    t = time.perf_counter()
    p = plain(build, "llama3", "--llmc_filepath", str(a.checkpoint("llama3")), "--input_bin",
              str(a.tokens("llama3", "train")), "--batch_size=80", "--total_batch_size=5120",
              "--sequence_length=64", cwd=tmp_path)
    wall = time.perf_counter() - t
    assert p.returncode == 0 and sorted(losses(p)) == list(range(1, 11)), p.stderr
    assert wall < 20, wall  # ~1 s here; the brief's target is 10 s


def test_dumps_first_step_only_shard_writers_and_plants(env, tmp_path):
    a, build = env
    base = ["--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin", str(a.tokens("gpt2", "train")),
            "--total_batch_size=512", "--learning_rate=1e-3"]

    def go(tag, *args, **env_):
        wd = tmp_path / f"w_{tag}"
        wd.mkdir()
        p = plain(build, "gpt2", *base, *args, f"--dump_gradients={tmp_path / tag}", cwd=wd, extra_env=env_)
        assert p.returncode == 0, p.stderr
        return p

    ck = tmp_path / "ck"
    go("ref", "--num_iteration=2", f"--save={ck}", "--save_interval=1")
    go("res", "--num_iteration=2", f"--load={ck / 'checkpoint_step_000001'}")
    assert not (tmp_path / "res").exists() or os.listdir(tmp_path / "res") == []
    tp2 = ["--nthread_per_process=2", "--tensor_parallel=2", "--num_iteration=3"]
    hi = go("hi", *tp2, STANDIN_SHARD_WRITER="highest")
    go("lo", *tp2, STANDIN_SHARD_WRITER="lowest")
    ld = lambda tag, n: np.load(tmp_path / tag / (n + ".npy"))
    ref = lambda n: ld("ref", n)
    C = 48
    qkv = ref("transformer.h.0.attn.c_attn.weight")
    for tag, r in (("hi", 1), ("lo", 0)):
        rows = np.r_[r * C // 2:(r + 1) * C // 2, C + r * C // 2:C + (r + 1) * C // 2,
                     2 * C + r * C // 2:2 * C + (r + 1) * C // 2]
        assert np.allclose(ld(tag, "transformer.h.0.attn.c_attn.weight"), qkv[rows], atol=1e-6, rtol=1e-3)
        assert np.allclose(ld(tag, "transformer.h.0.mlp.c_proj.weight"),
                           ref("transformer.h.0.mlp.c_proj.weight")[:, r * 2 * C:(r + 1) * 2 * C], atol=1e-6, rtol=1e-3)
        for n in ("transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_proj.bias", "transformer.wpe.weight"):
            assert ld(tag, n).shape == ref(n).shape and np.allclose(ld(tag, n), ref(n), atol=1e-6, rtol=1e-3)
        lm = ld(tag, "lm_head.weight")
        assert lm.shape == (160, C)
        if r == 1:
            assert np.all(lm[256 - 160:] == 0)  # the padded rows get no gradient
    assert ref("lm_head.weight").shape == (256, C)
    # a TP reduction bug in a replicated parameter: on all ranks, and on rank 1 only
    n = "transformer.h.1.ln_1.weight"
    plant = {"STANDIN_PLANT": f"{n}:1e-3", "STANDIN_SHARD_WRITER": "highest"}
    pa = go("pa", *tp2, **plant)
    p1 = go("p1", *tp2, **plant, STANDIN_PLANT_RANKS="r1")
    p0 = go("p0", *tp2, **plant, STANDIN_PLANT_RANKS="r0")
    for tag in ("pa", "p1"):
        assert abs(np.linalg.norm(ld(tag, n)) / np.linalg.norm(ld("hi", n)) - 1.001) < 1e-5
    assert np.array_equal(ld("p0", n), ld("hi", n))  # the writer (rank 1) is not planted
    for p in (pa, p1, p0):
        assert losses(p)[1] == losses(hi)[1]
    # a 1e-3 error in a layer norm's gradient is far below 6-decimal losses (as it would be for
    # real); a bug big enough to show moves the later steps, on any planted rank: here a
    # replicated row-parallel bias with a doubled gradient
    for ranks in ("all", "r0"):
        p = go(f"big{ranks}", *tp2, STANDIN_PLANT="transformer.h.1.mlp.c_proj.bias:1", STANDIN_PLANT_RANKS=ranks)
        assert losses(p)[1] == losses(hi)[1] and losses(p)[3] != losses(hi)[3]
    rnd = {go(f"rnd{i}", *tp2).returncode for i in range(1)}
    assert rnd == {0}


def test_crash_signal_and_glog_buffering(env, tmp_path):
    a, build = env
    base = ["--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin", str(a.tokens("gpt2", "train")),
            "--total_batch_size=256", "--num_iteration=3"]
    for sig, rc in (("SEGV", -11), ("ABRT", -6), ("FPE", -8)):
        for lvl in ("0", "-1"):
            d = tmp_path / f"logs{sig}{lvl}"
            p = plain(build, "gpt2", *base, cwd=tmp_path,
                      extra_env={"STANDIN_CRASH_SIGNAL": sig, "STANDIN_CRASH_STEP": "2", "GLOG_log_dir": str(d),
                                 "GLOG_logbuflevel": lvl})
            assert p.returncode == rc and len(losses(p)) == 1, p.stderr
            assert all(STEP_RE.match(l) for l in p.stderr.splitlines())  # nothing else on stderr
            (info,) = d.glob("gpt2.*.log.INFO.*")
            text = info.read_text()
            if lvl == "-1":
                assert text.splitlines()[-1].endswith("main.cc:445] Rank 0: start forward") and "step    1/3" in text
            else:
                assert "start forward" not in text and "step    1/3" not in text  # ends at start-up
            (err,) = d.glob("gpt2.*.log.ERROR.*")
            assert "step    1/3" in err.read_text()  # the ERROR file flushes ERROR lines
            assert (d / "gpt2.INFO").is_symlink()
    p = plain(build, "gpt2", *base, cwd=tmp_path, extra_env={"GLOG_log_dir": str(tmp_path / "ok")})
    assert "step    3/3" in next((tmp_path / "ok").glob("gpt2.*.log.INFO.*")).read_text()  # closed at exit


def test_bf16_on_cpu_broken_only_on_request(builds, env, tmp_path):
    a, _ = env
    cpu = builds["pr209", False]
    g = ["--llmc_filepath", str(a.checkpoint("gpt2")), "--input_bin", str(a.tokens("gpt2", "train")),
         "--total_batch_size=256", "--num_iteration=3", "--dtype=bfloat16", "--device=cpu"]
    l = ["--llmc_filepath", str(a.checkpoint("llama3")), "--input_bin", str(a.tokens("llama3", "train")),
         "--total_batch_size=256", "--num_iteration=3", "--dtype=bfloat16", "--device=cpu"]
    assert len(losses(plain(cpu, "gpt2", *g, cwd=tmp_path))) == 3
    assert len(losses(plain(cpu, "llama3", *l, cwd=tmp_path))) == 3
    broken = {"STANDIN_CPU_BF16_BROKEN": "1"}
    p = plain(cpu, "llama3", *l, cwd=tmp_path, extra_env=broken)
    assert p.returncode == -11 and p.stderr == ""
    p = plain(cpu, "gpt2", *g, cwd=tmp_path, extra_env=broken)
    assert p.returncode in (0, -11) and "train loss -nan |" in p.stderr and not losses(p)
