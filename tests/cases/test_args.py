"""harness.cases.args: a case's flags (InfiniTrain's config mapped onto ours, foreign flags passed through)."""

from __future__ import annotations

import json

from harness.cases import load_config
from tests.cases.config_files import DATA


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
    # GPT2_TEST_GROUPS=basic,zero: as InfiniTrain's runner reads it (feat/support_moe), gpt2
    # runs no checkpoint case; llama3 keeps its runner's default groups, checkpoint among them.
    assert "checkpoint/gpt2/ckpt_no_resume" not in cases
    assert cases["checkpoint/llama3/ckpt_no_resume"].args["save"] == "/data/ckpt/no_resume"
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
