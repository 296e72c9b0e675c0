"""The config loader, schema and InfiniTrain mapping: plain unit tests (no pytest plugin)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.cases import ConfigError, Tolerance, load_config
from harness.cases.schema import schema_text

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def write(tmp_path, data) -> Path:
    path = tmp_path / "test_config.json"
    path.write_text(json.dumps(data))
    return path


def minimal(**extra):
    data = {"test_groups": [{"tag": "basic", "tests": [{"id": "pp2", "args": {"pipeline_parallel": 2}}]}]}
    data.update(extra)
    return data


def test_shipped_schema_file_matches_the_code():
    assert (ROOT / "configs" / "test_config.schema.json").read_text() == schema_text()


def test_shipped_config_loads_with_the_layout_matrix():
    config = load_config(ROOT / "configs" / "test_config.json")
    assert config.tags == ("basic", "pipeline_layout", "schedules")
    names = [c.name for c in config.cases]
    assert len(names) == len(set(names))
    layout = [c for c in config.cases if c.tag == "pipeline_layout"]
    assert {c.model for c in layout} == {"gpt2", "llama3"}
    for kind in ("partition", "costs", "chunks", "megatron"):
        for parallel in ("pp2-", "pp2-dp2-", "pp2-tp2-"):
            assert any(c.case_id.startswith(parallel) and kind in c.case_id for c in layout), (kind, parallel)
    assert max(c.world_size for c in config.cases) == 8
    # The layout matrix stays mostly small; the schedule matrix is mostly 8 devices (PP x DP x
    # TP per schedule, nightly) and its CI cost is bounded in tests/plugin/test_coverage.py.
    small = [c for c in config.cases if c.tag != "schedules"]
    assert sum(c.world_size <= 4 for c in small) >= 0.75 * len(small)
    assert all(c.flags["num_iteration"] == 4 for c in config.cases)  # typed "@ITERATIONS@"


def test_defaults_ids_and_order(tmp_path):
    config = load_config(write(tmp_path, minimal()))
    assert [c.name for c in config.cases] == ["basic/gpt2/pp2", "basic/llama3/pp2"]
    case = config.cases[0]
    assert case.world_size == 2 and case.dp == 1
    assert case.flags["total_batch_size"] == 4 * 64  # one microbatch per dp rank by default
    assert case.tolerances.loss == Tolerance(1e-5, 0.0)
    assert case.reference_flags() == {k: case.flags[k] for k in (
        "dtype", "batch_size", "sequence_length", "total_batch_size", "num_iteration",
        "learning_rate", "weight_decay", "optimizer", "seed")}


def test_tolerance_overrides_per_dtype_group_and_case(tmp_path):
    data = minimal(tolerances={"bfloat16": {"loss": {"atol": 0.05}}})
    group = data["test_groups"][0]
    group["tolerances"] = {"gradients": {"rtol": 0.1}}
    group["tests"] = [{"id": "a", "args": {"dtype": "bfloat16"}},
                      {"id": "b", "args": {}, "tolerances": {"loss": {"atol": 1e-3, "rtol": 1e-4}}}]
    a, _, b, _ = load_config(write(tmp_path, data)).cases
    assert a.tolerances.loss == Tolerance(0.05, 0) and a.tolerances.gradients == Tolerance(3e-3, 0.1)
    assert b.tolerances.loss == Tolerance(1e-3, 1e-4) and b.tolerances.gradients == Tolerance(1e-5, 0.1)


def test_variables_substitute_strings_and_typed_values(tmp_path):
    data = minimal(variables={"PART": "3,5", "PP": 2, "DIR": "/data"},
                   model_files={"gpt2": {"checkpoint": "@DIR@/g.bin", "input_bin": "@DIR@/t.bin"}})
    data["test_groups"][0]["tests"][0]["args"] = {"pipeline_parallel": "@PP@",
                                                  "pipeline_layer_partition": "@PART@"}
    config = load_config(write(tmp_path, data))
    assert config.cases[0].flags["pipeline_parallel"] == 2
    assert config.cases[0].flags["pipeline_layer_partition"] == "3,5"
    assert config.files_for("gpt2").checkpoint == Path("/data/g.bin")
    assert config.files_for("llama3").synthetic


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(modelz=[]), "top level: unknown key 'modelz'; expected one of: "),
    (lambda d: d["test_groups"][0].update(tests=[{"args": {}}]),
     "tag 'basic', tests[0]: missing required key 'id'"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_parallel=[2]),
     "tag 'basic', case 'pp2', field args.pipeline_parallel: [2] is not of type integer or string"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_parallel="two"),
     "case 'pp2', field args.pipeline_parallel: 'two' is not an integer"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(dtype="fp16"),
     "case 'pp2', field args.dtype: 'fp16' is not one of float32, bfloat16"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(pipeline_paralel=2),
     "case 'pp2', field args.pipeline_paralel: unknown trainer flag 'pipeline_paralel'; did "
     "you mean 'pipeline_parallel'?"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(zero_stage=5),
     "case 'pp2', field args.zero_stage: 5 is not an integer from 0 to 3"),
    (lambda d: d["test_groups"][0].update(reference={"dtype": "bfloat16"}),
     "tag 'basic', field reference: reference.dtype: not a topology flag; a reference keeps the "
     "case's mathematics and may only name its topology"),
    (lambda d: d.update(reference={"tensor_parallel": 3, "nthread_per_process": 4}),
     "case 'pp2', field reference: 4 processes is not a multiple of tensor_parallel * "
     "pipeline_parallel = 3 * 1 = 3"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(output_dir="x"),
     "case 'pp2', field args.output_dir: is set by the harness"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(nthread_per_process=3),
     "case 'pp2', field args.nthread_per_process: 3 processes is not a multiple of"),
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(total_batch_size=100),
     "case 'pp2', field args.total_batch_size: 100 is not a multiple of batch_size * "
     "sequence_length * data-parallel size = 4 * 64 * 1 = 256"),
    (lambda d: d["test_groups"][0]["tests"][0].update(id="pp 2"),
     "tag 'basic', case 'pp 2', field id: 'pp 2' does not match the pattern"),
    (lambda d: d["test_groups"][0].update(tag="pipeline-layout"),
     "tag 'pipeline-layout', field tag: 'pipeline-layout' does not match the pattern"),
    (lambda d: d.update(models=["gpt3"]), "field models[0]: 'gpt3' is not one of 'gpt2', 'llama3'"),
    (lambda d: d.update(compare={"loss": False, "gradients": False}),
     "field compare: compares nothing"),
    (lambda d: d.update(trainer={"backend": "command"}),
     "field trainer: backend 'command' needs a `command` template"),
])
def test_bad_configs_give_one_line_naming_file_case_field(tmp_path, mutate, message):
    data = minimal()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message in text, text


def test_invalid_json_and_nan_are_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"test_groups": [}')
    with pytest.raises(ConfigError, match=r"c.json: invalid JSON at line 1 column 18"):
        load_config(path)
    path.write_text('{"tolerances": {"float32": {"loss": {"atol": NaN}}}, "test_groups": []}')
    with pytest.raises(ConfigError, match="NaN is not a number JSON allows"):
        load_config(path)


@pytest.mark.parametrize("atol, rtol", [(-1, 0), (math.nan, 0), (0, math.inf), (True, 0)])
def test_tolerance_rejects_negative_and_non_finite(atol, rtol):
    with pytest.raises(ValueError, match="expected a finite number >= 0"):
        Tolerance(atol, rtol)


def test_infinitrain_config_loads_and_maps_onto_our_flags():
    config = load_config(DATA / "infinitrain_test_config.json")
    cases = {c.name: c for c in config.cases}
    assert config.tags == ("basic", "zero", "checkpoint")
    three = cases["basic/gpt2/3"]  # nthread_per_process 8: 8 processes, all data parallel
    assert (three.world_size, three.dp, three.tp, three.pp) == (8, 8, 1, 1)
    assert three.flags["total_batch_size"] == 5120 and three.flags["batch_size"] == 10
    assert "nthread_per_process" not in three.flags
    eight = cases["basic/llama3/8"]
    assert (eight.world_size, eight.dp, eight.tp, eight.pp, eight.vpp) == (8, 2, 2, 2, 2)
    assert eight.flags["sequence_parallel"] is True
    assert cases["basic/gpt2/1"].world_size == 1
    assert cases["zero/gpt2/3_zero2"].unsupported == ("zero_stage",)
    assert cases["checkpoint/gpt2/ckpt_no_resume"].args["save"] == "/data/ckpt/no_resume"
    assert not cases["basic/gpt2/8"].unsupported
    # The flags exactly as the file says (no defaults invented), and the reference rule.
    assert three.args == {"dtype": "float32", "nthread_per_process": 8, "num_iteration": 10,
                          "batch_size": 10, "total_batch_size": 5120}
    assert three.reference_args() == {"dtype": "float32", "num_iteration": 10,
                                      "batch_size": 10, "total_batch_size": 5120}
    assert eight.reference_args() == cases["basic/llama3/2"].reference_args() | {
        "batch_size": 40}


def test_a_foreign_flag_passes_through_as_written_and_stays_in_the_reference(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"test_groups": [{"tag": "t", "tests": [{"id": "a", "args": {
        "tensor_parallel": 2, "data_parallel": 1, "my_new_flag": "x,y", "lora_rank": 8}}]}]}))
    case = load_config(path).cases[0]
    assert case.args == {"tensor_parallel": 2, "my_new_flag": "x,y", "lora_rank": 8}
    assert case.passthrough == ("my_new_flag",)
    assert case.unsupported == ("my_new_flag", "lora_rank")  # the bundled trainer lacks them
    assert case.reference_args() == {"my_new_flag": "x,y", "lora_rank": 8}
    assert "my_new_flag" not in case.flags and case.world_size == 2


def test_a_reference_topology_from_top_group_or_case(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"reference": {"tensor_parallel": 2}, "test_groups": [
        {"tag": "t", "reference": {"pipeline_parallel": 2}, "tests": [
            {"id": "a", "args": {"pipeline_parallel": 4}},
            {"id": "b", "reference": {"data_parallel": 2, "tensor_parallel": "@TP@"},
             "args": {}}]}], "variables": {"TP": 4}}))
    a, b = [c for c in load_config(path).cases if c.model == "gpt2"]
    assert (a.reference_topology, a.reference_world_size) == ({"pipeline_parallel": 2}, 2)
    # The nearest reference given wins, whole (a topology is not merged flag by flag).
    assert b.reference_topology == {"data_parallel": 2, "tensor_parallel": 4}
    assert b.reference_world_size == 8
    assert all(c.reference_topology == {"tensor_parallel": 2} for c in load_config(
        _with(path, lambda d: d["test_groups"][0].pop("reference"))).cases if c.case_id == "a")


def _with(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def test_case_line_points_at_the_case_id_under_its_tag(tmp_path):
    from harness.cases.node_ids import case_line

    path = tmp_path / "c.json"
    path.write_text('{"test_groups": [\n {"tag": "a", "tests": [\n  {"id": "x"}]},\n'
                    ' {"tag": "b", "tests": [\n  {"id": "y"},\n  {"id": "x"}]}]}\n')
    assert case_line(path, "a", "x") == 3
    assert case_line(path, "b", "x") == 6
    assert case_line(path, "b", "zz") is None
    assert case_line(tmp_path / "missing.json", "a", "x") is None
