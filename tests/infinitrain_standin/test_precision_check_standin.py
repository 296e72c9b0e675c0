"""The stand-in's emulated ``--precision_check "level=1,save_tensors=true,path=DIR"`` (InfiniTrain
master's module-level precision checker, precision_check.py): the folder, names, order, shapes
and log lines of the real binary's (copied into precision_check_{gpt2,llama3}_order.txt), values
that are the stand-in model's own, STANDIN_PLANT_MODULE, and the multi-rank layout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.infinitrain_standin import precision_check as pcm
from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model import F32, Config, Model, Numerics, param_names

HERE = Path(__file__).parent
LINE_RE = re.compile(r"^\[GAS-0\] \[L-0\] (\S+) tensor\[0\]: dtype=float32 shape=\(([0-9,]*)\) "
                     r"min=(\S+) max=(\S+) mean=(\S+) \[([^\]]*)\] \[NaN:(\d+) Inf:(\d+)\]$")
PRESET = ["--num_iteration", "1", "--batch_size", "4", "--sequence_length", "64", "--total_batch_size", "256"]


def fixture_order(family: str) -> list[tuple[str, str]]:
    """The real binary's (logged name, shape) list, in order."""
    rows = []
    for line in (HERE / f"precision_check_{family}_order.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, shape = line.split(" ")
            rows.append((name, shape))
    return rows


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from harness.assets import ensure_assets
    a = ensure_assets("infinitrain")
    root = tmp_path_factory.mktemp("build")
    return a, {"master": make_build_dir(root / "master", flavour="master"),
               "pr209": make_build_dir(root / "pr209", flavour="pr209")}


def run(env, tmp_path, *args, model="gpt2", flavour="master", plant=None, pc=None, device=("--device", "cuda")):
    a, builds = env
    out = tmp_path / "pc"
    cmd = [str(builds[flavour] / model), "--llmc_filepath", str(a.checkpoint(model)),
           "--input_bin", str(a.tokens(model, "train")), *PRESET, *device,
           "--precision_check", pc if pc is not None else f"level=1,save_tensors=true,path={out}", *args]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GLOG_", "STANDIN_", "PROC_", "GLOBAL_PROC"))}
    if plant:
        e["STANDIN_PLANT_MODULE"] = plant
    wd = tmp_path / "work"
    wd.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(cmd, cwd=wd, env=e, capture_output=True, text=True, timeout=120)
    return p, out


def the_folder(out: Path) -> Path:
    stamps = os.listdir(out)
    assert len(stamps) == 1 and re.fullmatch(r"\d{8}_\d{6}", stamps[0]), stamps
    return out / stamps[0]


def log_rows(folder: Path, rank: int = 0) -> list[re.Match]:
    lines = (folder / f"precision_check_rank_{rank}.log").read_text().splitlines()
    rows = [LINE_RE.match(l) for l in lines]
    assert all(rows), [l for l, m in zip(lines, rows) if not m][:3]
    return rows


def npy(folder: Path, rank: int, entry: str) -> np.ndarray:
    return np.load(folder / f"rank_{rank}" / f"{entry}.npy")


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_module_order_is_the_real_binarys(family):
    """module_order() for the preset's 8 layers, forward then backward, is the real log's list."""
    fwd, bwd = pcm.module_order(family, list(range(8)))
    names = [n + "_forward" for n, _ in fwd] + [n + "_backward" for n, _ in bwd]
    assert names == [n for n, _ in fixture_order(family)]


def test_parse_as_precision_check_config():
    c = pcm.parse("")
    assert (c.level, c.output_path, c.format, c.save_tensors) == (0, "./log_precision_check", "simple", False)
    c = pcm.parse("level=1,save_tensors=1,noise,path=a=b,level= 2x,format=md5,md5_tolerance=1e-3")
    assert (c.level, c.output_path, c.format, c.save_tensors, c.md5_tolerance) == (2, "a=b", "md5", True, 1e-3)
    assert pcm.parse("save_tensors=yes").save_tensors is False


def test_bad_strings_die_as_the_real_one(env, tmp_path):
    """std::stoi / std::stod throw, uncaught: libstdc++'s terminate message, SIGABRT, no folder."""
    for text, kind, what in (("level=abc,path=x", "std::invalid_argument", "stoi"),
                             ("level=99999999999", "std::out_of_range", "stoi"),
                             ("level=1,md5_tolerance=tiny", "std::invalid_argument", "stod")):
        p, _ = run(env, tmp_path, pc=text)
        assert p.returncode == -signal.SIGABRT, (text, p.returncode, p.stderr)
        assert p.stderr.endswith(f"terminate called after throwing an instance of '{kind}'\n  what():  {what}\n")
        assert not (tmp_path / "work" / "x").exists() and "[PrecisionCheck]" not in p.stdout
    p, out = run(env, tmp_path, pc=f"level=0,save_tensors=true,path={tmp_path / 'off'}")
    assert p.returncode == 0 and not (tmp_path / "off").exists() and p.stdout == ""


def test_preset_run_writes_the_real_folder(env, tmp_path):
    """gpt2 at the harness's infinitrain preset shape, one step: one timestamp folder holding
    precision_check_rank_0.log and rank_0/, the log's names, shapes and order and the file set
    those of the real binary; each .npy is float32 of the logged shape and its statistics are
    the line's; the loss entry is the step line's loss."""
    p, out = run(env, tmp_path)
    assert p.returncode == 0, p.stderr
    folder = the_folder(out)
    assert sorted(os.listdir(folder)) == ["precision_check_rank_0.log", "rank_0"]
    assert p.stdout.splitlines()[:2] == [f"[PrecisionCheck] Output: {folder}",
                                         f"[Rank 0] Precision check output: {folder}/precision_check_rank_0.log"]
    rows = log_rows(folder)
    real = fixture_order("gpt2")
    assert [(m.group(1), f"({m.group(2)})") for m in rows] == real
    assert sorted(os.listdir(folder / "rank_0")) == sorted(n + ".npy" for n, _ in real)
    for m in rows:
        a = npy(folder, 0, m.group(1))
        assert a.dtype == np.float32 and a.shape == tuple(int(d) for d in m.group(2).split(",") if d)
        flat = a.reshape(-1)
        assert (m.group(3), m.group(4)) == (pcm._num(flat.min()), pcm._num(flat.max()))
        assert m.group(6) == ", ".join(pcm._num(v) for v in flat[:6]) + (", ..." if flat.size > 6 else "")
        assert (m.group(7), m.group(8)) == ("0", "0")
    loss = float(re.search(r"train loss (\d+\.\d+)", p.stderr).group(1))
    assert abs(float(npy(folder, 0, "CrossEntropyLoss_forward")) - loss) < 1e-6
    assert float(npy(folder, 0, "CrossEntropyLoss_backward")) == 1.0  # d loss / d loss, GA 1
    # a module's forward output feeds the next: wte + wpe is the first stage's output
    first = npy(folder, 0, "transformer.wte_forward") + npy(folder, 0, "transformer.wpe_forward")[None]
    assert np.array_equal(first, npy(folder, 0, "TransformerFirstStage_forward"))
    # lm_head's output gradient is (softmax - one-hot) / n: each token's row sums to 0
    dl = npy(folder, 0, "lm_head_backward")
    assert np.abs(dl.sum(-1)).max() < 1e-8 and dl.min() < 0 < dl.max()


def test_trace_values_are_the_models_own():
    """In process: the forward entries are the model's module outputs, and the per-token output
    gradients reproduce the model's parameter gradients (ln_1's weight: sum over tokens of
    grad_out * input; c_fc's bias: sum of grad_out)."""
    rng = np.random.default_rng(1)
    for family in ("gpt2", "llama3"):
        C, V, L, T, B = 8, 23, 2, 5, 3
        cfg = Config(family, T, V, L, 2, C, V, n_kv_head=2, ffn=12)
        P = {}
        shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C), "lm_head.weight": (V, C)}
        for n in param_names(cfg):
            mod, leaf = n.rsplit(".", 1)
            if n in shapes:
                shp = shapes[n]
            elif mod.endswith(("ln_1", "ln_2", "ln_f")) or mod.endswith("c_proj") and leaf == "bias":
                shp = (C,)
            elif mod.endswith("c_attn"):
                shp = (cfg.qkv_rows, C) if leaf == "weight" else (cfg.qkv_rows,)
            elif mod.endswith(("c_fc", "c_fc2")):
                shp = (cfg.hidden, C) if leaf == "weight" else (cfg.hidden,)
            else:
                shp = (C, cfg.hidden) if mod.endswith("mlp.c_proj") else (C, C)
            P[n] = (rng.standard_normal(shp) * 0.3).astype(F32)
        model = Model(cfg, P, Numerics())
        x = rng.integers(0, 6, B * T)  # repeats: the distinct-row path is exercised
        y = rng.integers(0, V, B * T)
        pos = np.tile(np.arange(T), B)
        loss0, g0 = model.forward_backward(x, y, pos, 0.5)
        trace = {}
        loss, g = model.forward_backward(x, y, pos, 0.5, trace=trace)
        assert loss == loss0 and all(np.array_equal(np.asarray(_d(g[k])), np.asarray(_d(g0[k]))) for k in g0)
        fw, bw = trace["forward"], trace["backward"]
        assert fw["CrossEntropyLoss"] == loss and bw["CrossEntropyLoss"] == F32(0.5)
        h0 = fw["TransformerFirstStage"]
        assert np.allclose((bw["transformer.h.0.ln_1"] * h0).sum(0), g["transformer.h.0.ln_1.weight"],
                           rtol=1e-4, atol=1e-6)
        m = fw["transformer.h.1.ln_2"]
        assert m.shape == (B * T, C)
        if family == "gpt2":
            assert np.allclose(bw["transformer.h.1.mlp.c_fc"].sum(0), g["transformer.h.1.mlp.c_fc.bias"],
                               rtol=1e-4, atol=1e-6)
            assert np.allclose(fw["transformer.h.1.mlp.gelu"], np.tanh(fw["transformer.h.1.mlp.c_fc"]))
        assert np.allclose(fw["lm_head"], fw["transformer.ln_f"] @ P["lm_head.weight"].T, atol=1e-5)


def _d(v):
    return v.dense() if hasattr(v, "dense") else v


@pytest.mark.parametrize("plant, module", [("transformer.h.0.mlp.gelu:1.0001", "transformer.h.0.mlp.gelu"),
                                           ("transformer.h.0.ln_1:1.0001", "transformer.h.0.ln_1")])
def test_planted_module(env, tmp_path, plant, module):
    """STANDIN_PLANT_MODULE scales that module's forward output on one device: every entry
    before it is bit for bit the unplanted run's, its own is off by the scale, the logits move,
    the loss by under 1e-5 relative (a loss check passes it)."""
    p0, out0 = run(env, tmp_path / "a")
    p1, out1 = run(env, tmp_path / "b", plant=plant)
    assert p0.returncode == 0 and p1.returncode == 0, p1.stderr
    f0, f1 = the_folder(out0), the_folder(out1)
    names = [m.group(1) for m in log_rows(f0)]
    at = names.index(module + "_forward")
    for n in names[:at]:
        assert np.array_equal(npy(f0, 0, n), npy(f1, 0, n)), n
    a0, a1 = npy(f0, 0, names[at]), npy(f1, 0, names[at])
    assert not np.array_equal(a0, a1)
    assert np.allclose(a1, a0 * F32(1.0001), rtol=1e-6, atol=0)
    l0, l1 = (float(npy(f, 0, "CrossEntropyLoss_forward")) for f in (f0, f1))
    assert abs(l1 - l0) / l0 < 1e-5  # (ln_1's 1e-4 leaves the float32 loss as it was)
    assert not np.array_equal(npy(f0, 0, "lm_head_forward"), npy(f1, 0, "lm_head_forward"))
    # the harness's walk over the two traces (harness.compare.trace, the self-check's
    # thresholds) names the planted module first, the one before it last matched
    from harness.compare.trace import Naming, compare_traces
    from harness.runner.trace import SELF_CHECK_THRESHOLDS

    diff = compare_traces(out1, out0, Naming(), SELF_CHECK_THRESHOLDS, step=1,
                          partner="reference", remove=False)
    assert (diff.first_diverging.module, diff.first_diverging.phase) == (module, "forward")
    assert diff.last_matched.label == names[at - 1].rsplit("_", 1)[0] + " forward"
    assert diff.line().startswith(f"first diverging: {module} forward (rank 0)")
    assert compare_traces(out0, out0, Naming(), SELF_CHECK_THRESHOLDS, step=1,
                          partner="reference", remove=False).ok
    bad = run(env, tmp_path / "c", plant="transformer.h.99.ln_1:2")[0]
    assert bad.returncode == 2 and "STANDIN_PLANT_MODULE" in bad.stderr


def test_last_iteration_remains(env, tmp_path):
    """Two steps: the log holds both iterations (the counters restart: the same names), the
    files the second's."""
    p, out = run(env, tmp_path, "--num_iteration", "2")
    assert p.returncode == 0, p.stderr
    folder = the_folder(out)
    rows = log_rows(folder)
    n = len(fixture_order("gpt2"))
    assert len(rows) == 2 * n and [m.group(1) for m in rows[:n]] == [m.group(1) for m in rows[n:]]
    assert len(os.listdir(folder / "rank_0")) == n
    losses = [float(v) for v in re.findall(r"train loss (\d+\.\d+)", p.stderr)]
    assert abs(float(npy(folder, 0, "CrossEntropyLoss_forward")) - losses[1]) < 1e-6
    i = [m.group(1) for m in rows[:n]].index("transformer.h.0.ln_1_forward")
    a = npy(folder, 0, "transformer.h.0.ln_1_forward").reshape(-1)
    assert rows[n + i].group(6).startswith(pcm._num(a[0])) and rows[i].group(6) != rows[n + i].group(6)


def test_gradient_accumulation_suffixes(env, tmp_path):
    """Two microbatches a step: the second's entries are <name>_1_<phase>, after the first's."""
    p, out = run(env, tmp_path, "--total_batch_size", "512")
    assert p.returncode == 0, p.stderr
    folder = the_folder(out)
    names = [m.group(1) for m in log_rows(folder)]
    real = [n for n, _ in fixture_order("gpt2")]
    second = [re.sub(r"_(forward|backward)$", r"_1_\1", n) for n in real]
    assert names == real + second
    assert float(npy(folder, 0, "CrossEntropyLoss_backward")) == 0.5


def test_tensor_and_data_parallel_ranks(env, tmp_path):
    """DP 2 x TP 2 in one process: one timestamp folder, a log and a folder per global rank,
    column-parallel outputs the rank's slice ([q_r | k_r | v_r] of c_attn), the loss module
    VocabParallelCrossEntropyLoss; DP rank 0's two TP slices of the first c_attn are the
    single-device run's output."""
    p, out = run(env, tmp_path / "tp", "--nthread_per_process", "4", "--tensor_parallel", "2",
                 "--total_batch_size", "512", flavour="pr209", device=())
    assert p.returncode == 0, p.stderr
    folder = the_folder(out)
    assert sorted(os.listdir(folder)) == sorted([f"precision_check_rank_{r}.log" for r in range(4)]
                                                + [f"rank_{r}" for r in range(4)])
    shapes = {m.group(1): m.group(2) for m in log_rows(folder, 1)}
    assert shapes["transformer.h.0.attn.c_attn_forward"] == "4,64,72"
    assert shapes["transformer.h.0.mlp.gelu_backward"] == "4,64,96"
    assert shapes["transformer.h.0.attn.c_proj_forward"] == "4,64,48"
    assert "VocabParallelCrossEntropyLoss_forward" in shapes and "CrossEntropyLoss_forward" not in shapes
    p1, out1 = run(env, tmp_path / "one", flavour="pr209")
    whole = npy(the_folder(out1), 0, "transformer.h.0.attn.c_attn_forward")
    s = [npy(folder, r, "transformer.h.0.attn.c_attn_forward") for r in (0, 1)]
    q, k, v = (np.concatenate([t[..., j * 24:(j + 1) * 24] for t in s], -1) for j in range(3))
    assert np.array_equal(np.concatenate([q, k, v], -1), whole)
    assert not np.array_equal(npy(folder, 2, "transformer.wte_forward"), npy(folder, 0, "transformer.wte_forward"))


def test_pipeline_stages_local_names(env, tmp_path):
    """PP 2: each stage's own modules, its blocks named by local index; the first stage has the
    embeddings and no head, the last the head and the loss; no Transformer entry (the model's
    Forward does not run under PP). The stand-in's order for a stage is its own convention."""
    p, out = run(env, tmp_path, "--nthread_per_process", "2", "--pipeline_parallel", "2", flavour="pr209",
                 device=())
    assert p.returncode == 0, p.stderr
    folder = the_folder(out)
    n0 = [m.group(1) for m in log_rows(folder, 0)]
    n1 = [m.group(1) for m in log_rows(folder, 1)]
    assert n0[0] == "transformer.wte_forward" and "lm_head_forward" not in n0
    assert n1[0] == "transformer.h.0.ln_1_forward" and "CrossEntropyLoss_forward" in n1
    assert not any(n.startswith(("transformer.h.4", "Transformer_")) for n in n0 + n1)
    # stage 1's local block 0 is global block 4: the same output as the single-device run's h.4
    p1, out1 = run(env, tmp_path / "one", flavour="pr209")
    assert np.array_equal(npy(folder, 1, "transformer.h.0_forward"), npy(the_folder(out1), 0, "transformer.h.4_forward"))
