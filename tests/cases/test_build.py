"""harness.cases.build: variables and model files."""

from __future__ import annotations

from pathlib import Path

from harness.cases import load_config
from tests.cases.config_files import minimal, write


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
