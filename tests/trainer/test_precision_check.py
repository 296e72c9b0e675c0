"""`--precision_check`: the bundled trainer writes InfiniTrain's module-level trace.

What InfiniTrain master (b24d92f) writes is in tests/trainer/data/infinitrain_gpt2_precision_check.txt
(every logged name of a real 8-layer GPT-2 CPU run, in order, and its first log line verbatim).
In process: the option parser's errors, the log line's form, and one GPT-2 run (2 steps of 2
microbatches) against that listing and against tensors recomputed here from the checkpoint.
Through torchrun (CPU, gloo): PP=2 and TP=2 runs against the single-device run, and the three
planted bugs of tests/trace_plants/shim.py, each seen first at its module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.contracts.flags import FlagError
from harness.trainer.main import main
from harness.trainer.precision_check import (PrecisionCheckConfig, format_line,
                                             parse_precision_check)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parent / "data" / "infinitrain_gpt2_precision_check.txt"
STAMP = re.compile(r"^\d{8}_\d{6}$")
# precision_checker.cc:352-371, the simple format
LINE = re.compile(
    r"^\[GAS-0\] \[L-0\] (?P<logged>\S+) tensor\[(?P<i>\d+)\]: dtype=(?P<dtype>\w+) "
    r"shape=\((?P<shape>[\d,]*)\) min=\S+ max=\S+ mean=\S+ \[(?:\S+, ){0,5}\S+(?:, \.\.\.)?\] "
    r"\[NaN:\d+ Inf:\d+\]( <- ERROR)?$")
# InfiniTrain's containers (named by type, no counterpart module in the bundled model)
INFINITRAIN_ONLY = ("TransformerFirstStage", "TransformerChunk", "TransformerLastStage",
                    "Transformer", "CrossEntropyLoss")


def _reference():
    lines = REFERENCE.read_text().splitlines()
    names = [line for line in lines if line and not line.startswith(("#", "LINE "))]
    first = next(line for line in lines if line.startswith("LINE "))[len("LINE "):]
    return names, first


# -------------------------------------------------------------------------- the option string


@pytest.mark.parametrize("text, words", [
    ("level=2,save_tensors=true", ["--precision_check", "level=2", "not supported",
                                   "level 0 or 1"]),
    ("level=1,colour=red", ["--precision_check", "unknown key 'colour'", "expected level"]),
    ("level=1,save_tensors=maybe", ["save_tensors='maybe'", "expected true, false"]),
    ("level=1,format=table", ["format='table'", "expected one of simple, md5"]),
    ("level=x", ["level='x'", "expected 0 (off) or 1"]),
    ("level=1,path", ["item 'path' is not key=value"]),
    ("level=1,path=", ["path is empty"]),
])
def test_a_bad_option_string_is_one_error_naming_the_flag_value_and_what_was_expected(text,
                                                                                      words):
    with pytest.raises(FlagError) as error:
        parse_precision_check(text)
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_the_option_string_parses_as_infinitrains():
    assert parse_precision_check("level=1,save_tensors=true,path=/x") == PrecisionCheckConfig(
        level=1, path="/x", save_tensors=True)
    assert parse_precision_check("level=1,format=md5,md5_tolerance=1e-3").format == "md5"
    # empty, missing and level 0: off (InfiniTrain's Parse default)
    for off in (None, "", "level=0,save_tensors=1"):
        assert not parse_precision_check(off).enabled


def test_a_bad_option_string_exits_2_before_a_model_is_built(tiny_assets, capsys):
    code = main(["--llmc_filepath", str(tiny_assets.checkpoint("gpt2")),
                 "--input_bin", str(tiny_assets.tokens("gpt2")),
                 "--precision_check", "level=2"])
    assert code == 2
    assert "--precision_check='level=2': level=2" in capsys.readouterr().err


def test_the_log_line_is_infinitrains():
    _, real = _reference()
    assert LINE.match(real), real  # the form, checked against InfiniTrain's own line
    config = PrecisionCheckConfig(level=1)
    data = np.array([[1.5, -2.0, 0.1, 3.0, 4.0, 5.0, 1e-7]], dtype=np.float32)
    line = format_line("h.0.mlp.gelu_1_forward", 0, data, "float32", config)
    assert line == ("[GAS-0] [L-0] h.0.mlp.gelu_1_forward tensor[0]: dtype=float32 shape=(1,7) "
                    "min=-2 max=5 mean=1.65714 [1.5, -2, 0.1, 3, 4, 5, ...] [NaN:0 Inf:0]")
    bad = np.array([np.nan, 1.0, np.inf], dtype=np.float32)
    line = format_line("x_backward", 0, bad, "bfloat16", config)
    assert line.endswith("min=1 max=1 mean=1 [nan, 1, inf] [NaN:1 Inf:1] <- ERROR"), line
    assert LINE.match(line)


# -------------------------------------------------------------------------- one device


@pytest.fixture(scope="module")
def one_device(tiny_assets, tmp_path_factory):
    """GPT-2, 2 steps of 2 microbatches (B=4, T=64), lr 1e-30 (SGD: no weight moves) so both steps see the checkpoint's
    weights; returns (timestamp folder, the assets)."""
    out = tmp_path_factory.mktemp("trace1")
    code = main(["--llmc_filepath", str(tiny_assets.checkpoint("gpt2")),
                 "--input_bin", str(tiny_assets.tokens("gpt2")),
                 "--batch_size", "4", "--sequence_length", "64", "--total_batch_size", "512",
                 "--num_iteration", "2", "--learning_rate", "1e-30",
                 "--precision_check", f"level=1,save_tensors=true,path={out / 'pc'}"])
    assert code == 0
    (stamp,) = list((out / "pc").iterdir())
    return stamp, tiny_assets


def _logged(stamp: Path, rank: int = 0) -> list[str]:
    return [LINE.match(line).group("logged")
            for line in (stamp / f"precision_check_rank_{rank}.log").read_text().splitlines()]


def _calls(logged: list[str]) -> dict[tuple[str, str], int]:
    """(module, phase) -> calls in one iteration's logged names, read as InfiniTrain's counter
    writes them (`h.0.ln_1_forward` is call 0 of h.0.ln_1; `h.0.ln_1_1_forward` its call 1)."""
    calls: dict[tuple[str, str], int] = {}
    for name in logged:
        stem, phase = name.rsplit("_", 1)
        match = re.match(r"^(.*)_(\d+)$", stem)
        if match and calls.get((match.group(1), phase), 0) == int(match.group(2)) > 0:
            stem = match.group(1)
        calls[(stem, phase)] = calls.get((stem, phase), 0) + 1
    return calls


def test_the_folder_log_and_files_have_infinitrains_shape(one_device, capsys):
    stamp, _ = one_device
    assert STAMP.match(stamp.name)
    assert sorted(p.name for p in stamp.iterdir()) == ["precision_check_rank_0.log", "rank_0"]
    lines = (stamp / "precision_check_rank_0.log").read_text().splitlines()
    assert all(LINE.match(line) for line in lines), [x for x in lines if not LINE.match(x)][:3]
    logged = _logged(stamp)
    files = sorted(p.name for p in (stamp / "rank_0").iterdir())
    # the log keeps both steps' lines (opened once); the counters restart every step, so the
    # files are one per (name, phase, idx): the second step's, over the first's
    half = len(logged) // 2
    assert logged[:half] == logged[half:]
    assert files == sorted(f"{name}.npy" for name in logged[:half])
    assert len(files) == len(set(files))
    # two microbatches: every (module, phase) twice per step, the second with the _1 suffix
    calls = _calls(logged[:half])
    assert sorted(calls.values()) == [2] * len(calls) and len(calls) == len(files) // 2
    array = np.load(stamp / "rank_0" / "h.0.mlp.gelu_forward.npy")
    assert array.dtype == np.float32 and array.shape == (4, 64, 128) and array.flags.c_contiguous


def test_names_in_execution_order_are_infinitrains(one_device):
    """The first microbatch's entries (no idx suffix) against a real InfiniTrain run: the same
    names without `transformer.` (InfiniTrain's containers aside), forward in the same order;
    backward in the same order but wte / wpe, siblings after the one add that torch's engine
    runs latest-created first."""
    stamp, _ = one_device
    real, _ = _reference()
    real = [n.removeprefix("transformer.") for n in real
            if not any(n.startswith(c + "_") for c in INFINITRAIN_ONLY)]
    ours = _logged(stamp)
    ours = [n for n in ours[: len(ours) // 2] if not re.search(r"(?<!ln)_1_(forward|backward)$", n)]
    assert sorted(ours) == sorted(real)
    forward = [n for n in ours if n.endswith("_forward")]
    assert forward == [n for n in real if n.endswith("_forward")]
    backward = [n for n in ours if n.endswith("_backward")]
    expected = [n for n in real if n.endswith("_backward")]
    assert expected[-2:] == ["wte_backward", "wpe_backward"]
    assert backward == expected[:-2] + ["wpe_backward", "wte_backward"]


def test_forward_outputs_and_output_gradients_are_the_tensors_recomputed_here(one_device):
    """Step 2's microbatches recomputed from the checkpoint: h.0.attn.c_attn's output and the
    logits' gradient (softmax - one-hot) / tokens / microbatches (the loss is the step's mean)."""
    from harness.contracts.llmc import read_checkpoint, read_tokens
    from harness.trainer.data import StepBatches

    stamp, assets = one_device
    checkpoint = read_checkpoint(assets.checkpoint("gpt2"), mmap=True)
    config, w = checkpoint.config, {k: torch.from_numpy(np.array(v)) for k, v in
                                    checkpoint.tensors.items()}
    batches = StepBatches(read_tokens(assets.tokens("gpt2"), vocab_size=config.vocab_size),
                          4, 64, 2)
    batches.next_step()
    inputs, targets = batches.next_step()  # step 2: the files that remain
    for micro, suffix in ((0, ""), (1, "_1")):
        x = torch.from_numpy(inputs[micro]).long()
        h = w["wte.weight"][x] + w["wpe.weight"][:64]
        ln = F.layer_norm(h, (config.n_embd,), w["h.0.ln_1.weight"], w["h.0.ln_1.bias"], 1e-5)
        qkv = ln @ w["h.0.attn.c_attn.weight"].T + w["h.0.attn.c_attn.bias"]
        got = np.load(stamp / "rank_0" / f"h.0.attn.c_attn{suffix}_forward.npy")
        assert np.abs(got - qkv.numpy()).max() <= 1e-5
        logits = np.load(stamp / "rank_0" / f"lm_head{suffix}_forward.npy")
        probabilities = torch.softmax(torch.from_numpy(logits).double(), -1)
        onehot = F.one_hot(torch.from_numpy(targets[micro]).long(), config.vocab_size)
        expected = (probabilities - onehot) / (4 * 64) / 2
        got = np.load(stamp / "rank_0" / f"lm_head{suffix}_backward.npy")
        assert np.abs(got - expected.numpy()).max() <= 1e-8


# -------------------------------------------------------------------------- torchrun


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra.pop("shim", None), str(ROOT),
                                                      env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _trace(assets, out: Path, nproc: int, extra=(), **env) -> Path:
    """A 1-step GPT-2 run of 2 microbatches (B=2, T=32); its timestamp folder."""
    args = ["-m", "harness.trainer", "--llmc_filepath", str(assets.checkpoint("gpt2")),
            "--input_bin", str(assets.tokens("gpt2")), "--batch_size", "2",
            "--sequence_length", "32", "--total_batch_size", "128", "--num_iteration", "1",
            "--precision_check", f"level=1,save_tensors=true,path={out}", *extra]
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(nproc)] if nproc > 1 else [sys.executable])
    proc = subprocess.run(launcher + args, cwd=ROOT, env=_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"[PrecisionCheck] Output: {out}" in proc.stdout
    (stamp,) = list(out.iterdir())  # ONE timestamp folder for every rank
    assert STAMP.match(stamp.name)
    return stamp


@pytest.fixture(scope="module")
def single(tiny_assets, tmp_path_factory):
    return _trace(tiny_assets, tmp_path_factory.mktemp("single") / "pc", 1)


def _load(stamp: Path, rank: int, logged: str) -> np.ndarray:
    return np.load(stamp / f"rank_{rank}" / f"{logged}.npy")


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(b).max())


@pytest.mark.torchrun
def test_pp2_and_tp2_write_stage_local_modules_and_tp_local_shapes(tiny_assets, single,
                                                                    tmp_path):
    from harness.trainer.parallel.tensor_parallel import qkv_shard_permutation

    pp = _trace(tiny_assets, tmp_path / "pp", 2, ["--pipeline_parallel", "2"])
    assert sorted(p.name for p in pp.iterdir()) == [
        "precision_check_rank_0.log", "precision_check_rank_1.log", "rank_0", "rank_1"]
    stage0, stage1 = _logged(pp, 0), _logged(pp, 1)
    layers = [{int(m.group(1)) for n in names if (m := re.match(r"h\.(\d+)", n))}
              for names in (stage0, stage1)]
    assert layers == [{0, 1, 2, 3}, {4, 5, 6, 7}]  # global layer indices on each stage
    assert "wte_forward" in stage0 and "lm_head_forward" not in stage0
    assert "lm_head_forward" in stage1 and "ln_f_1_backward" in stage1 and "wte_forward" not in stage1
    # the two microbatches as InfiniTrain counts them; gradients of the step's loss (the
    # schedule's per-microbatch loss scaled back): equal to the single-device run's
    for rank, names in ((0, stage0), (1, stage1)):
        assert len(names) == len(set(names))
        for name in names:
            assert _close(_load(pp, rank, name), _load(single, 0, name)), (rank, name)
    assert sorted(stage0 + stage1) == sorted(_logged(single))

    tp = _trace(tiny_assets, tmp_path / "tp", 2, ["--tensor_parallel", "2"])
    perm = qkv_shard_permutation(4, 4, 8, 2).numpy()
    for rank in (0, 1):
        assert _logged(tp, rank) == _logged(single)
        c_fc = _load(single, 0, "h.3.mlp.c_fc_1_forward")
        assert _load(tp, rank, "h.3.mlp.c_fc_1_forward").shape == (2, 32, 64)
        assert _close(_load(tp, rank, "h.3.mlp.c_fc_1_forward"),
                      c_fc[..., rank * 64:(rank + 1) * 64])
        # c_attn's rows are re-ordered so a rank holds whole heads: its slice is [q_r; k_r; v_r]
        c_attn = _load(single, 0, "h.3.attn.c_attn_forward")
        assert _close(_load(tp, rank, "h.3.attn.c_attn_forward"),
                      c_attn[..., perm[rank * 48:(rank + 1) * 48]])
        assert _close(_load(tp, rank, "h.3.mlp.c_proj_backward"),
                      _load(single, 0, "h.3.mlp.c_proj_backward"))
        assert _close(_load(tp, rank, "h.3_forward"), _load(single, 0, "h.3_forward"))


def _first_difference(run: Path, rank: int, single: Path) -> tuple[str, list[str]]:
    """(the first logged tensor that differs from the single-device run's, the ones before
    it), comparing tensors of equal shape (a TP slice has no single-device twin here)."""
    before = []
    for name in _logged(run, rank):
        a, b = _load(run, rank, name), _load(single, 0, name)
        if a.shape != b.shape:
            continue
        if not _close(a, b):
            return name, before
        before.append(name)
    return "", before


@pytest.mark.torchrun
def test_each_planted_bug_is_first_seen_at_its_module(tiny_assets, single, tmp_path):
    from tests.trace_plants.shim import write_shim

    shim = str(write_shim(tmp_path / "shim").parent)
    # ln_1 of layer 2 with eps 1e-1 (planted in multi-process runs only: PP 2, the layer on
    # stage 0): everything before h.2.ln_1's output matches
    ln = _trace(tiny_assets, tmp_path / "ln", 2, ["--pipeline_parallel", "2"], shim=shim,
                HARNESS_TRACE_PLANT="ln_eps=2")
    first, before = _first_difference(ln, 0, single)
    assert first == "h.2.ln_1_forward" and "h.1_forward" in before, (first, before[-3:])

    # the row-parallel all-reduce scaled on TP rank 1: rank 1 parts at h.0.attn.c_proj, rank 0
    # only after the next all-reduce mixes rank 1's partial sum in (h.0.mlp.c_proj)
    tp = _trace(tiny_assets, tmp_path / "tp", 2, ["--tensor_parallel", "2"], shim=shim,
                HARNESS_TRACE_PLANT="tp_allreduce=1")
    first, before = _first_difference(tp, 1, single)
    assert first == "h.0.attn.c_proj_forward" and "h.0.ln_1_forward" in before, first
    first, before = _first_difference(tp, 0, single)
    assert first == "h.0.mlp.c_proj_forward" and "h.0.attn.c_proj_forward" in before, first

    # stage 0 sends microbatch 0's activation as microbatch 1's: stage 1's first module on
    # microbatch 1 parts; stage 0's forward all matches, its backward parts at microbatch 1
    pp = _trace(tiny_assets, tmp_path / "pp", 2, ["--pipeline_parallel", "2"], shim=shim,
                HARNESS_TRACE_PLANT="pp_microbatch")
    first, before = _first_difference(pp, 1, single)
    assert first == "h.4.ln_1_1_forward" and "h.4.ln_1_forward" in before, first
    first, before = _first_difference(pp, 0, single)
    assert first == "h.3_1_backward", first
    assert all(name in before for name in _logged(pp, 0) if name.endswith("_forward"))
