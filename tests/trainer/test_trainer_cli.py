"""The single-device trainer through its command line: records, step line, dumps, bad input."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from harness.layout import PipelineLayout
from harness.layout.profile import MEMORY_FORMAT, RECORD_FORMAT
from harness.trainer.gradient_dump import read_manifest
from harness.trainer.main import main
from harness.trainer.models import build_model
from harness.contracts.records import read_steps

STEP_LINE = re.compile(
    r"^step +(\d+)/3 \| train loss (\d+\.\d{6}) \| lr 1\.00e-03 \| \(\d+\.\d ms \| \d+ tok/s \| "
    r"peak used: \d+ MB \| DP=1, TP=1, PP=1\)$"
)


def _flags(assets, model, out):
    return [
        "--llmc_filepath", str(assets.checkpoint(model)),
        "--input_bin", str(assets.tokens(model)),
        "--batch_size", "2", "--sequence_length", "16", "--total_batch_size", "64",
        "--num_iteration", "3", "--learning_rate", "1e-3",
        "--output_dir", str(out), "--dump_gradients", str(out / "grads"),
        "--profile_layers", str(out / "timings.jsonl"),
    ]


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_cli_trains_and_writes_records_step_lines_and_gradients(tiny_assets, tmp_path, model):
    result = subprocess.run(
        [sys.executable, "-m", "harness.trainer", "--model", model,
         *_flags(tiny_assets, model, tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("step")]
    matches = [STEP_LINE.match(line) for line in lines]
    assert all(matches) and [int(m.group(1)) for m in matches] == [1, 2, 3], lines

    steps = read_steps(tmp_path)
    assert [s["step"] for s in steps] == [1, 2, 3]
    # The log line is rounded; the record keeps full precision.
    for match, record in zip(matches, steps):
        assert float(match.group(2)) == pytest.approx(record["loss"], abs=5e-7)
        assert record["tokens_per_s"] > 0 and record["peak_memory_mb"] > 0
    assert 4.0 < steps[0]["loss"] < 7.0  # near ln(256) for a fresh synthetic model

    run = json.loads((tmp_path / "run.json").read_text())
    assert run["format"] == "harness.run/1" and run["flags"]["model"] == model
    assert PipelineLayout.from_dict(run["layout"]) == PipelineLayout.uniform(8, 1)
    assert run["environment"]["world_size"] == 1 and run["environment"]["torch"]
    assert run["parallel"] == {"pp": 1, "dp": 1, "tp": 1, "vpp": 1, "schedule": None, "microbatches": 2}

    # Gradient dump: one file per parameter, single-device names, the parameter's shape.
    from harness.contracts.llmc import read_checkpoint_header

    _, config = read_checkpoint_header(tiny_assets.checkpoint(model))
    expected = {name: tuple(p.shape) for name, p in build_model(config).named_parameters()}
    manifest = read_manifest(tmp_path / "grads")
    assert {p["name"]: tuple(p["shape"]) for p in manifest["parameters"]} == expected
    for name, shape in expected.items():
        gradient = np.load(tmp_path / "grads" / f"{name}.npy")
        assert gradient.shape == shape and gradient.dtype == np.float32
        assert np.isfinite(gradient).all()
    assert np.abs(np.load(tmp_path / "grads" / "h.7.mlp.c_fc.weight.npy")).max() > 0

    # Per-layer timings in the suggestion tool's format: every layer, every step.
    records = [json.loads(line) for line in (tmp_path / "timings.jsonl").read_text().splitlines()]
    timings = [r for r in records if r["format"] == RECORD_FORMAT]  # then one memory record a step
    assert [r["step"] for r in records if r["format"] == MEMORY_FORMAT] == [1, 2, 3]
    assert {(t["step"], t["layer"]) for t in timings} == {
        (step, layer) for step in (1, 2, 3) for layer in [*range(8), "embedding", "lm_head"]
    }
    assert all(t["forward_ms"] > 0 and t["backward_ms"] > 0 for t in timings)
    assert f"layer profile written: {tmp_path / 'timings.jsonl'}\n" in result.stdout


def test_mixtral_trains_with_adam_on_its_checkpoint_and_llama3_tokens(tiny_assets, tmp_path, capsys):
    # tiny_mixtral's optimizer (Adam, betas 0.9 / 0.999, no weight decay) on the tiny preset
    argv = [*_flags(tiny_assets, "mixtral", tmp_path)[:-2], "--model", "mixtral",
            "--optimizer", "adamw", "--adam_beta2", "0.999", "--weight_decay", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if STEP_LINE.match(line)]) == 3, out
    losses = [s["loss"] for s in read_steps(tmp_path)]
    assert 4.0 < losses[0] < 7.0 and losses[2] < losses[0]
    from harness.contracts.llmc import read_checkpoint_header

    _, config = read_checkpoint_header(tiny_assets.checkpoint("mixtral"))
    expected = {name for name, _ in build_model(config).named_parameters()}
    dumped = {p["name"] for p in read_manifest(tmp_path / "grads")["parameters"]}
    assert dumped == expected  # every expert got tokens in the first step's 64
    assert np.abs(np.load(tmp_path / "grads" / "h.7.mlp.experts.expert_3.c_fc2.weight.npy")).max() > 0
    assert np.abs(np.load(tmp_path / "grads" / "h.0.mlp.router.weight.npy")).max() > 0


def test_profiled_run_feeds_the_suggestion_tool(tiny_assets, tmp_path):
    assert main(_flags(tiny_assets, "gpt2", tmp_path)) == 0
    ask = [sys.executable, "-m", "harness.layout.suggest", "--pipeline-parallel", "2",
           "--profile", str(tmp_path / "timings.jsonl"), "--json"]
    # A one-device profile for two stages is taken only when asked (issue 25: another shape).
    refused = subprocess.run(ask, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "recorded with --pipeline_parallel 1" in refused.stderr
    result = subprocess.run([*ask, "--any-profile-shape"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    suggestion = json.loads(result.stdout)
    assert sum(suggestion["partition"]) == 8 and len(suggestion["partition"]) == 2


def test_same_seed_and_files_give_bitwise_identical_losses(tiny_assets, tmp_path):
    for run in ("a", "b"):
        assert main(_flags(tiny_assets, "llama3", tmp_path / run)) == 0
    losses = [[s["loss"] for s in read_steps(tmp_path / run)] for run in ("a", "b")]
    assert losses[0] == losses[1] and len(losses[0]) == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "llama3"], "--model=llama3, but --llmc_filepath="),
        (["--sequence_length", "65"], "--sequence_length=65 exceeds the model's block_size 64"),
        (["--total_batch_size", "48"], "--total_batch_size=48 is not a multiple of"),
        (["--pipeline_layer_partition", "3,5"], "--pipeline_layer_partition"),
        (["--pipeline_layer_costs", "1x7"], "--pipeline_layer_costs"),
        (["--pipeline_model_parallel_layout", "Et*8NLm"], "'m'"),
        (["--pipeline_schedule", "1F1B"], "--pipeline_schedule=1F1B needs --pipeline_parallel > 1"),
    ],
)
def test_bad_input_is_refused_before_training_with_one_message(
    tiny_assets, tmp_path, capsys, extra, message
):
    argv = [*_flags(tiny_assets, "gpt2", tmp_path), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "steps.jsonl").exists()


def test_missing_and_damaged_files_are_refused_naming_the_file(tiny_assets, tmp_path, capsys):
    argv = _flags(tiny_assets, "gpt2", tmp_path)
    missing = str(tmp_path / "nope.bin")
    assert main([*argv, "--input_bin", missing]) == 2
    assert missing in capsys.readouterr().err
    damaged = tmp_path / "short.bin"
    damaged.write_bytes(tiny_assets.checkpoint("gpt2").read_bytes()[:-4])
    assert main([*argv, "--llmc_filepath", str(damaged)]) == 2
    assert str(damaged) in capsys.readouterr().err


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_bfloat16_compute_tracks_float32_and_optimizers_lower_the_loss(tiny_assets, tmp_path, optimizer):
    common = [*_flags(tiny_assets, "gpt2", tmp_path), "--optimizer", optimizer,
              "--learning_rate", "3e-3", "--num_iteration", "6"]
    assert main([*common, "--output_dir", str(tmp_path / "fp32")]) == 0
    assert main([*common, "--output_dir", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    fp32 = [s["loss"] for s in read_steps(tmp_path / "fp32")]
    bf16 = [s["loss"] for s in read_steps(tmp_path / "bf16")]
    assert fp32 != bf16  # bf16 really ran in bf16
    assert np.allclose(bf16, fp32, atol=5e-2)
    if optimizer == "adamw":
        assert fp32[-1] < fp32[0] - 0.1


@pytest.mark.parametrize("model", ["gpt2", "llama3", "mixtral"])
def test_float64_trains_in_float64_and_agrees_with_float32(tiny_assets, tmp_path, model):
    """--dtype float64, the calibration's oracle: parameters, activations, loss and the
    gradient dump in float64, within float32's rounding of the float32 run."""
    common = [*_flags(tiny_assets, model, tmp_path)[:-2]]  # no profile
    assert main([*common, "--output_dir", str(tmp_path / "fp32"),
                 "--dump_gradients", str(tmp_path / "fp32" / "grads")]) == 0
    assert main([*common, "--output_dir", str(tmp_path / "fp64"),
                 "--dump_gradients", str(tmp_path / "fp64" / "grads"), "--dtype", "float64"]) == 0
    fp32 = np.array([s["loss"] for s in read_steps(tmp_path / "fp32")])
    fp64 = np.array([s["loss"] for s in read_steps(tmp_path / "fp64")])
    assert len(fp64) == 3 and not np.array_equal(fp32, fp64)  # it really ran another dtype
    np.testing.assert_allclose(fp64, fp32, rtol=1e-5, atol=0)
    run = json.loads((tmp_path / "fp64" / "run.json").read_text())
    assert run["flags"]["dtype"] == "float64"
    names = [p["name"] for p in read_manifest(tmp_path / "fp64" / "grads")["parameters"]]
    for name in names:
        wide = np.load(tmp_path / "fp64" / "grads" / f"{name}.npy")
        narrow = np.load(tmp_path / "fp32" / "grads" / f"{name}.npy")
        assert wide.dtype == np.float64 and narrow.dtype == np.float32
        # the float32 run's gradient is the float64 one up to float32 rounding (~1e-7)
        assert np.linalg.norm(wide - narrow) <= 1e-5 * np.linalg.norm(wide) + 1e-12, name


def test_float64_is_one_device_only_and_no_case_dtype(tiny_assets, tmp_path, capsys):
    from harness.contracts.flags import FLAG_TABLE, FlagError

    argv = [*_flags(tiny_assets, "gpt2", tmp_path), "--dtype", "float64",
            "--pipeline_parallel", "2"]
    assert main(argv) == 2
    assert "--dtype=float64 runs on one device only" in capsys.readouterr().err
    assert not (tmp_path / "steps.jsonl").exists()
    with pytest.raises(FlagError):  # a case config cannot ask for it: no thresholds of its own
        FLAG_TABLE["dtype"].check("float64")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_is_refused_before_training(tiny_assets, tmp_path, capsys):
    assert main([*_flags(tiny_assets, "gpt2", tmp_path), "--device", "cuda"]) == 2
    assert capsys.readouterr().err == "error: --device=cuda but torch sees no CUDA device\n"
    assert not (tmp_path / "steps.jsonl").exists()


def test_a_cpu_run_keeps_freed_memory_before_it_builds_the_model(tiny_assets, tmp_path, monkeypatch):
    # host_memory says why: without it a layer's CPU time depends on which layers share its rank.
    from harness.trainer import host_memory, models

    events = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: events.append("keep") or True)
    build = models.build_model
    monkeypatch.setattr(models, "build_model", lambda *a, **k: events.append("build") or build(*a, **k))
    assert main(_flags(tiny_assets, "gpt2", tmp_path)) == 0
    assert events == ["keep", "build"]
