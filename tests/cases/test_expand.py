"""harness.cases.expand: test groups -> cases, with defaults, tolerances and references layered."""

from __future__ import annotations

import json

from harness.cases import Tolerance, load_config
from tests.cases.config_files import changed, minimal, write


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
        changed(path, lambda d: d["test_groups"][0].pop("reference"))).cases if c.case_id == "a")
