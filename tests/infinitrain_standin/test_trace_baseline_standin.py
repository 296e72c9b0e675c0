"""The baseline's step-1 module check (`--harness-baseline pytorch`, harness.runner.trace
Tracer.baseline_module_check) through sessions on the InfiniTrain stand-in's master build, a
single-device gpt2 case whose self-check passes: the stand-in traces the step as InfiniTrain's
`--precision_check` does (tests/infinitrain_standin/precision_check.py), the bundled PyTorch
trainer traces it too, and `baseline.trace` names the first module whose numbers part, under
the bundled trainer's names (InfiniTrain's `transformer.` prefix gone).

The stand-in's model is a toy (tests/infinitrain_standin/model.py: its ln_1 is h * weight +
bias, no normalisation), not GPT-2: the embeddings are the checkpoint's on both sides, bit for
bit, and the first block's ln_1 is where the toy parts (ratio ~960 of the threshold). So a
planted module is named only where it comes first: STANDIN_PLANT_MODULE=transformer.wpe:1.01
scales the position embedding's output on every run (one device too, so the self-check passes
it), and the module check names `wpe` forward, after `wte` matched. A scale of 1.001 is under
the baseline's threshold (TRACE_THRESHOLDS float32: atol 1e-5 + rtol 1e-3 of the largest value:
ratio 0.87 measured); 1.01 is 8.7x over it. Without the module check `baseline.trace` is null.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model_files import micro_model_vars


CASE = {"dtype": "float32", "num_iteration": 2, "batch_size": 4, "sequence_length": 64,
        "total_batch_size": 256}
NODE = "basic/gpt2/1"


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    root = tmp_path_factory.mktemp("trace-baseline")
    return make_build_dir(root / "build", flavour="master", models=("gpt2",)), \
        micro_model_vars(root)


def _session(tmp_path: Path, build: Path, var_args: list[str], env: dict) -> tuple:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"variables": {"BUILD_DIR": "../build"}, "test_groups": [
        {"tag": "basic", "tests": [{"id": "1", "args": CASE}]}]}))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
            str(tmp_path), "-p", "no:cacheprovider", "-q", f"--harness-config={config}",
            f"--infinitrain-build={build}", f"--harness-output={out}",
            "--harness-baseline", "pytorch", *var_args, f"{config}::{NODE}"]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, **env})
    results = sorted(out.glob("sessions/*/results.jsonl"))
    records = [json.loads(line) for line in results[-1].read_text().splitlines()] \
        if results else []
    assert [r["name"] for r in records] == [NODE], (result.stdout + result.stderr)[-3000:]
    return result, records[0]


def test_the_module_check_names_the_toys_first_block_without_a_plant(tmp_path, standin):
    build, var_args = standin
    _, record = _session(tmp_path, build, var_args, {"STANDIN_PLANT_MODULE": ""})
    assert record["self_check"] == "passed", record["reason"]
    baseline = record["baseline"]
    assert baseline["source"] == "pytorch (live)" and baseline["status"] == "failed", baseline
    trace = baseline["trace"]
    assert trace is not None and trace["status"] == "diverged", trace
    assert trace["partner"] == "pytorch baseline" and trace["step"] == 1, trace
    first, last = trace["first_diverging"], trace["last_matched"]
    assert (first["module"], first["phase"], first["rank"]) == ("h.0.ln_1", "forward", 0), first
    assert first["ratio"] > 100, first  # no rounding: the toy's ln_1 is no LayerNorm
    assert (last["module"], last["phase"], last["max_abs"]) == ("wpe", "forward", 0.0), last
    assert [(m["module"], m["max_abs"]) for m in trace["modules"][:2]] == \
        [("wte", 0.0), ("wpe", 0.0)]
    assert "modules at step 1: first diverging: h.0.ln_1 forward (rank 0)" in baseline["reason"]


def test_a_planted_position_embedding_is_named_at_wpe_by_the_baselines_module_check(
        tmp_path, standin):
    build, var_args = standin
    _, record = _session(tmp_path, build, var_args,
                         {"STANDIN_PLANT_MODULE": "transformer.wpe:1.01"})
    assert record["self_check"] == "passed", record["reason"]  # every run carries the plant
    baseline = record["baseline"]
    assert baseline["status"] == "failed", baseline
    trace = baseline["trace"]
    assert trace is not None and trace["status"] == "diverged", trace
    first, last = trace["first_diverging"], trace["last_matched"]
    assert (first["module"], first["phase"], first["index"], first["rank"]) == \
        ("wpe", "forward", 0, 0), first
    # 1e-2 of the output's largest value, against atol 1e-5 + rtol 1e-3 of it
    assert 5 < first["ratio"] < 15, first
    assert (last["module"], last["phase"], last["max_abs"]) == ("wte", "forward", 0.0), last
    assert "modules at step 1: first diverging: wpe forward (rank 0)" in baseline["reason"]
    assert record["status"] == "failed"
