"""The bundled trainer's planted bugs (tests/trace_plants/shim.py) located at their modules
through one real session (`--harness-trace failed`, the default): each planted case fails its
self-check, and the trace of its first diverging step against the single-device reference names
the module and rank where the plant acts; a control case without a plant passes with no trace.

- `ln_eps=5` (PP 2, layer 5 on stage 1): `h.5.ln_1` forward, on pipeline rank 1;
- `tp_allreduce=1` (TP 2): `h.0.attn.c_proj` forward (the first row-parallel output), on TP
  rank 1 only;
- `pp_microbatch` (PP 2, two microbatches): the second stage's first module `h.4.ln_1` on its
  second call (`#1`), on pipeline rank 1, after the first call and all of stage 0's forward
  matched.

One session serves every case (`HARNESS_TRACE_PLANT` in the config's `trainer.env`, each plant
bound to its case by `@<case id>`); the shim is on the session's own PYTHONPATH, so the zygote
imports it once and still serves every run. Without the trace stage every `trace` below is null
and no failure text names a module. And `--harness-trace none`: a failing case's trace null, its
failure text without a trace line (a second, one-case session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import INNER_SESSION_ARGS
from tests.plugin.conftest import plugin_args
from tests.trace_plants.shim import write_shim

PP2 = {"pipeline_parallel": 2}  # the tiny GPT-2's 8 layers: 0-3 on stage 0, 4-7 on stage 1
TP2 = {"tensor_parallel": 2}
CASES = [{"id": "ctl", "args": PP2}, {"id": "ln5", "args": PP2}, {"id": "tp2", "args": TP2},
         {"id": "pp2", "args": PP2}]
PLANT = "ln_eps=5@ln5,tp_allreduce=1@tp2,pp_microbatch@pp2"

_SESSION: dict = {}


def _config(where: Path, tests: list[dict], plant: str) -> Path:
    path = where / "cases.json"
    path.write_text(json.dumps({
        "models": ["gpt2"], "assets": {"preset": "tiny", "seed": 0},
        "trainer": {"env": {"HARNESS_TRACE_PLANT": plant}},
        # two microbatches of 2 x 16 tokens a step (the pipeline's two calls of each module)
        "defaults": {"batch_size": 2, "sequence_length": 16, "total_batch_size": 64,
                     "num_iteration": 2, "learning_rate": 0.001},
        "test_groups": [{"tag": "plant", "tests": tests}]}))
    return path


def session(where: Path, tests: list[dict], plant: str, *more: str):
    """One inner session, the shim on its PYTHONPATH; (the run, {case id: record}, seconds)."""
    where.mkdir(parents=True, exist_ok=True)
    shim = write_shim(where / "shim").parent
    config = _config(where, tests, plant)
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_OUTPUT"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(shim), env.get("PYTHONPATH")])),
               HARNESS_LAST_SESSION=str(where / "last_session"),
               PYTEST_ADDOPTS=" ".join([env.get("PYTEST_ADDOPTS", ""),
                                        *INNER_SESSION_ARGS]).strip())
    (where / "pytest.ini").write_text("[pytest]\n")
    started = time.time()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(where / "pytest.ini"), "--rootdir",
         str(where), *plugin_args(), "--harness-config", str(config), "--harness-output",
         str(where / "out"), "--harness-device", "cpu", "--gpus", "2", "-p",
         "no:cacheprovider", "-q", *more],
        cwd=where, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.time() - started
    results = sorted((where / "out").glob("sessions/*/results.jsonl"))
    records = {r["case_id"]: r for r in map(json.loads, results[-1].read_text().splitlines())} \
        if results else {}
    return run, records, seconds


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The one session of the three plants and the control."""
    if not _SESSION:
        run, records, seconds = session(tmp_path_factory.mktemp("plants"), CASES, PLANT)
        _SESSION.update(run=run, records=records, seconds=seconds)
    yield _SESSION["run"], _SESSION["records"]
    _SESSION.clear()


def _text(run) -> str:
    return (run.stdout + run.stderr)[-4000:]


def _located(records: dict, case: str) -> tuple[dict, dict]:
    record = records[case]
    assert record["status"] == "failed" and record["self_check"] == "failed", record["reason"]
    trace = record["trace"]
    assert trace is not None and trace["status"] == "diverged", trace
    assert trace["partner"] == "reference" and trace["step"] == 1, trace
    return record, trace


def test_the_session_fails_the_planted_cases_and_passes_the_control(planted):
    run, records = planted
    assert {c: r["status"] for c, r in records.items()} == {
        "ctl": "passed", "ln5": "failed", "tp2": "failed", "pp2": "failed"}, _text(run)
    # the control: no plant acted, and a passing case is not traced under `failed`
    assert records["ctl"]["trace"] is None
    assert records["ctl"]["self_check"] == "passed"


def test_a_norm_eps_on_stage_1_is_named_at_its_layers_ln_1_on_pipeline_rank_1(planted):
    _, records = planted
    record, trace = _located(records, "ln5")
    first = trace["first_diverging"]
    assert (first["module"], first["phase"], first["index"], first["rank"]) == \
        ("h.5.ln_1", "forward", 0, 1), first
    # the stage's layer before it (h.4, the first on stage 1) matched, bit for bit
    last = trace["last_matched"]
    assert (last["module"], last["phase"], last["index"], last["max_abs"]) == \
        ("h.4", "forward", 0, 0.0), last
    assert "first diverging: h.5.ln_1 forward (rank 1)" in record["errors"][0], \
        record["errors"][0]
    assert f"trace of step 1 against the reference: {trace['line']}" in record["errors"][0]


def test_a_row_parallel_all_reduce_scaled_on_tp_rank_1_is_named_at_c_proj_on_rank_1(planted):
    _, records = planted
    record, trace = _located(records, "tp2")
    first = trace["first_diverging"]
    assert (first["module"], first["phase"], first["index"], first["rank"]) == \
        ("h.0.attn.c_proj", "forward", 0, 1), first
    # the column-parallel c_attn before it matched: each rank's slice of each microbatch's
    # output (a step of two), never a slice of the other microbatch's
    last = trace["last_matched"]
    assert (last["module"], last["phase"], last["index"]) == \
        ("h.0.attn.c_attn", "forward", 0), last
    assert last["pieces"] == 2 and "part" in last["note"], last
    assert "first diverging: h.0.attn.c_proj forward (rank 1)" in record["errors"][0], \
        record["errors"][0]


def test_a_microbatch_sent_twice_is_named_at_the_next_stages_first_module_call_1(planted):
    _, records = planted
    record, trace = _located(records, "pp2")
    first = trace["first_diverging"]
    assert (first["module"], first["phase"], first["index"], first["rank"]) == \
        ("h.4.ln_1", "forward", 1, 1), first
    # its first call, and every call of stage 0's forward before it, matched
    modules = trace["modules"][: first["order"]]
    assert any(m["module"] == "h.4.ln_1" and m["index"] == 0 and m["ok"] for m in modules)
    assert all(m["ok"] for m in modules)
    last = trace["last_matched"]
    assert (last["module"], last["phase"], last["index"]) == ("h.3", "forward", 1), last
    assert "first diverging: h.4.ln_1 forward#1 (rank 1)" in record["errors"][0], \
        record["errors"][0]


def test_trace_none_leaves_a_failing_cases_trace_null_and_its_text_without_a_trace_line(
        tmp_path):
    run, records, _ = session(tmp_path, [{"id": "tp2", "args": TP2}], "tp_allreduce=1@tp2",
                              "--harness-trace", "none")
    record = records["tp2"]
    assert record["status"] == "failed" and record["self_check"] == "failed", _text(run)
    assert record["trace"] is None
    assert not any("trace of step" in e for e in record["errors"]), record["errors"]
    assert "first diverging:" not in run.stdout
