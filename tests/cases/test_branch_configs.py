"""InfiniTrain's feature branches' own scripts/test_config.json, unchanged, as the harness reads
them: which program runs which tag (harness.contracts.programs), what each case's reference
keeps (the flag table's roles for the branches' new flags), and what the session summary is
told once (harness.cases HarnessConfig.notes).

tests/infinitrain/data/branches/<branch>.json are the branches' files byte for byte
(`git show BRANCH:scripts/test_config.json` at feat/lr_scheduler a7949ac, feat/add_Qwen3-8B
a3f84f8, feat/support_moe b7e0760, feat/context_parallel d03ba16,
feat/activation_checkpointing e594d9c); master's is tests/infinitrain/data/
infinitrain_test_config.json.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.cases import ConfigError, Overrides, load_config
from tests.cases.config_files import write

DATA = Path(__file__).resolve().parents[1] / "infinitrain" / "data"
BRANCHES = DATA / "branches"
CONFIGS = {
    "master": DATA / "infinitrain_test_config.json",
    "lr_scheduler": BRANCHES / "feat_lr_scheduler.json",
    "qwen3": BRANCHES / "feat_add_Qwen3-8B.json",
    "support_moe": BRANCHES / "feat_support_moe.json",
    "context_parallel": BRANCHES / "feat_context_parallel.json",
    "activation_checkpointing": BRANCHES / "feat_activation_checkpointing.json",
}
BUILD = Overrides(build_dir="/nonexistent/build")


def _load(branch: str, **overrides):
    return load_config(CONFIGS[branch], Overrides(build_dir="/nonexistent/build", **overrides))


def _counts(config) -> dict:
    return dict(Counter((c.tag, c.model) for c in config.cases))


# (tag, program) -> cases, for each branch: gpt2 and llama3 run every tag where the config names
# no *_TEST_GROUPS variable (master's runner); on support_moe each program runs its groups.
EXPECTED = {
    "master": {**{(t, m): n for t, n in (("basic", 16), ("zero", 14), ("lora", 16),
                                          ("checkpoint", 6)) for m in ("gpt2", "llama3")}},
    "lr_scheduler": {(t, m): n for t, n in (("basic", 16), ("zero", 14), ("lr_scheduler", 10),
                                             ("lora", 16), ("checkpoint", 6))
                     for m in ("gpt2", "llama3")},
    "qwen3": {(t, m): n for t, n in (("basic", 16), ("zero", 8), ("lora", 16))
              for m in ("gpt2", "llama3")},
    "support_moe": {**{(t, m): n for t, n in (("basic", 16), ("zero", 14), ("lora", 16),
                                               ("checkpoint", 6)) for m in ("gpt2", "llama3")},
                    ("moe", "tiny_mixtral"): 4},
    "context_parallel": {(t, m): n for t, n in (("basic", 20), ("zero", 18), ("lora", 16),
                                                 ("checkpoint", 6))
                         for m in ("gpt2", "llama3")},
    "activation_checkpointing": {(t, m): n for t, n in (("basic", 16), ("zero", 14),
                                                         ("recompute", 14), ("lora", 16),
                                                         ("checkpoint", 6))
                                 for m in ("gpt2", "llama3")},
}


@pytest.mark.parametrize("branch", list(CONFIGS))
def test_every_branch_config_loads_unchanged_with_its_programs_per_tag(branch):
    config = _load(branch)
    assert _counts(config) == EXPECTED[branch]
    assert all(not c.skip for c in config.cases)
    builds = "builds" if branch in ("lr_scheduler", "qwen3") else "basic_compile_commands"
    assert any(f"{builds} (build_1" in note and "recorded, not run" in note
               for note in config.notes), config.notes
    # No flag of a branch's config is unknown to the flag table: each has its role.
    assert not [n for n in config.notes if n.startswith("flag --")], config.notes


def test_the_moe_tag_runs_tiny_mixtral_only_with_its_own_model_files():
    config = _load("support_moe")
    moe = [c for c in config.cases if c.tag == "moe"]
    assert {c.model for c in moe} == {"tiny_mixtral"} and len(moe) == 4
    files = config.files_for("tiny_mixtral")
    assert files.variables == ("MIXTRAL_LLMC_FILEPATH", "MIXTRAL_INPUT_BIN")
    assert files.checkpoint.name == "tiny_mixtral_megatron_export.bin"
    two = next(c for c in moe if c.case_id == "2")
    # tiny_mixtral's batch flags are mathematics: kept in the reference as they are
    assert two.reference_args() == {"dtype": "float32", "num_iteration": 10,
                                    "global_batch_size": 80, "micro_batch_size": 80}
    assert two.world_size == 1


def test_context_parallel_is_topology_and_divides_the_world_as_the_branch_does():
    cases = {c.name: c for c in _load("context_parallel").cases}
    nine = cases["basic/gpt2/9"]  # 4 threads, CP 2: DP 2 (global.cc:128)
    assert (nine.world_size, nine.cp, nine.dp, nine.tp, nine.pp) == (4, 2, 2, 1, 1)
    assert nine.reference_args() == {"dtype": "float32", "num_iteration": 10,
                                     "batch_size": 10, "total_batch_size": 5120}
    ten = cases["basic/llama3/10"]  # 8 threads, TP 2, CP 2, PP 2: DP 1
    assert (ten.world_size, ten.cp, ten.dp, ten.tp, ten.pp, ten.vpp) == (8, 2, 1, 2, 2, 2)
    assert "context_parallel" not in ten.reference_args()
    assert "cp_comm_type" not in ten.reference_args()


def test_a_world_that_tp_cp_pp_do_not_divide_is_the_configs_error(tmp_path):
    data = json.loads(CONFIGS["context_parallel"].read_text())
    data["test_groups"][0]["tests"][0]["args"].update(
        {"nthread_per_process": 6, "context_parallel": 4})
    with pytest.raises(ConfigError, match=r"6 processes is not a multiple of tensor_parallel \* "
                                          r"context_parallel \* pipeline_parallel = 1 \* 4 \* 1"):
        load_config(write(tmp_path, data), BUILD)


def test_a_recompute_case_is_compared_with_the_same_run_without_recompute():
    cases = {c.name: c for c in _load("activation_checkpointing").cases}
    one = cases["recompute/gpt2/2_recompute_uniform2"]
    assert one.args["activation_recompute"] is True
    # the reference is the same mathematics without any recompute flag (the role `memory`):
    # kept, a recompute case would be compared with a recompute run, the thing the tag checks
    assert one.reference_args() == {"dtype": "float32", "num_iteration": 10, "batch_size": 80,
                                    "total_batch_size": 5120}
    assert one.world_size == 1 and one.reference_args() != one.args


def test_the_lr_schedule_flags_are_mathematics_and_stay_in_the_reference():
    cases = {c.name: c for c in _load("lr_scheduler").cases}
    six = cases["lr_scheduler/gpt2/6_cosine_pp8"]
    kept = six.reference_args()
    assert {k: kept[k] for k in ("lr_decay_style", "min_lr", "lr_warmup_iters",
                                 "lr_warmup_init", "lr_decay_iters")} == {
        "lr_decay_style": "cosine", "min_lr": 1e-6, "lr_warmup_iters": 2,
        "lr_warmup_init": 0.0, "lr_decay_iters": 10}
    assert "pipeline_parallel" not in kept and "nthread_per_process" not in kept


def test_master_reads_as_before_the_groups_variables():
    config = _load("master")
    assert config.models == ("gpt2", "llama3")
    assert config.notes == (f"{CONFIGS['master']}: basic_compile_commands (build_1): recorded, "
                            f"not run: the harness tests the build folder it is given",)


# ------------------------------------------------------------------ the *_TEST_GROUPS variables

def test_a_groups_variable_decides_its_programs_tags_and_the_others_keep_their_defaults():
    config = _load("support_moe", variables={"GPT2_TEST_GROUPS": " basic , moe"})
    counts = _counts(config)
    assert counts[("basic", "gpt2")] == 16 and counts[("moe", "gpt2")] == 4
    assert ("zero", "gpt2") not in counts
    assert counts[("zero", "llama3")] == 14  # the variable given in the file
    assert counts[("moe", "tiny_mixtral")] == 4


def test_every_tag_with_a_star():
    counts = _counts(_load("support_moe", variables={"MIXTRAL_TEST_GROUPS": "*"}))
    assert counts[("basic", "tiny_mixtral")] == 16 and counts[("moe", "tiny_mixtral")] == 4


def test_a_groups_variable_naming_a_missing_tag_is_one_line_and_loses_no_case():
    config = _load("support_moe", variables={"MIXTRAL_TEST_GROUPS": "moe,mooe"})
    assert _counts(config) == EXPECTED["support_moe"]
    lines = [n for n in config.notes if "MIXTRAL_TEST_GROUPS" in n]
    assert lines == [f"{CONFIGS['support_moe']}: variable MIXTRAL_TEST_GROUPS='moe,mooe' names "
                     f"tag(s) 'mooe' that the config does not have (its tags: basic, zero, "
                     f"lora, checkpoint, moe); expected tags of its test_groups"]


def test_a_tag_no_program_runs_is_said():
    config = _load("support_moe", variables={"MIXTRAL_TEST_GROUPS": "basic"})
    assert ("moe", "tiny_mixtral") not in _counts(config)
    assert any("tag 'moe': no program runs it" in n and "MIXTRAL_TEST_GROUPS=basic" in n
               for n in config.notes), config.notes


def test_a_program_without_facts_is_listed_and_skipped_never_run_as_another():
    config = _load("support_moe", variables={"GEMMA_TEST_GROUPS": "basic"})
    gemma = [c for c in config.cases if c.model == "gemma"]
    assert len(gemma) == 16
    assert all("InfiniTrain program 'gemma' (variable GEMMA_TEST_GROUPS): the harness has no "
               "facts for it" in c.skip for c in gemma)
    assert all(not c.skip for c in config.cases if c.model != "gemma")


def test_qwen3_runs_the_tags_its_groups_variable_names_and_none_by_default():
    assert not [c for c in _load("support_moe").cases if c.model == "qwen3"]
    config = _load("support_moe", variables={"QWEN3_TEST_GROUPS": "basic"})
    qwen = [c for c in config.cases if c.model == "qwen3"]
    assert len(qwen) == 16 and {c.tag for c in qwen} == {"basic"}
    assert all(not c.skip for c in qwen)
    every = _load("support_moe", variables={"QWEN3_TEST_GROUPS": "*"})
    assert {c.tag for c in every.cases if c.model == "qwen3"} == set(every.tags)


def test_a_star_among_tag_names_is_one_line_naming_the_file_and_variable():
    with pytest.raises(ConfigError) as error:
        _load("support_moe", variables={"QWEN3_TEST_GROUPS": "*,basic"})
    text = str(error.value)
    assert str(CONFIGS["support_moe"]) in text and "QWEN3_TEST_GROUPS='*,basic'" in text
    assert "expected '*' alone or tag names" in text and "\n" not in text


def test_the_build_folder_decides_between_tiny_mixtral_and_its_rename(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "mixtral").write_text("")
    renamed = load_config(CONFIGS["support_moe"], Overrides(build_dir=str(build)))
    assert {c.model for c in renamed.cases if c.tag == "moe"} == {"mixtral"}
    (build / "mixtral").unlink()
    (build / "tiny_mixtral").write_text("")
    older = load_config(CONFIGS["support_moe"], Overrides(build_dir=str(build)))
    assert {c.model for c in older.cases if c.tag == "moe"} == {"tiny_mixtral"}


# ------------------------------------------------------------------ keys and flags it does not know

def test_an_infinitrain_top_level_key_the_harness_does_not_use_is_named_not_fatal(tmp_path):
    data = json.loads(CONFIGS["lr_scheduler"].read_text())
    data["nightly_owner"] = "someone"
    path = write(tmp_path, data)
    config = load_config(path, BUILD)
    assert f"{path}: top-level key 'nightly_owner' is InfiniTrain's own: not used by the " \
           f"harness" in config.notes
    assert len(config.cases) == 124


def test_the_harnesss_own_config_still_refuses_an_unknown_key(tmp_path):
    data = {"nightly_owner": "x", "test_groups": [{"tag": "basic", "tests": [{"id": "1"}]}]}
    with pytest.raises(ConfigError, match="unknown key 'nightly_owner'"):
        load_config(write(tmp_path, data))


def _with_flag(tmp_path, **extra):
    data = json.loads(CONFIGS["master"].read_text())
    three = next(t for t in data["test_groups"][0]["tests"] if t["id"] == "3")  # 8 threads
    three["args"]["cp_size"] = 2
    data.update(extra)
    return write(tmp_path, data)


def test_an_unknown_flag_is_named_with_the_role_taken_and_kept(tmp_path):
    config = load_config(_with_flag(tmp_path), BUILD)
    case = next(c for c in config.cases if c.name == "basic/gpt2/3")
    assert case.reference_args()["cp_size"] == 2
    [note] = [n for n in config.notes if n.startswith("flag --cp_size")]
    assert note.startswith("flag --cp_size (basic/gpt2/3, basic/llama3/3): not in the flag "
                           "table; assumed mathematics, so kept in each case's single-device "
                           "reference")
    assert "--harness-flag-role cp_size=ROLE" in note


def test_a_declared_role_drops_the_flag_from_the_reference(tmp_path):
    path = _with_flag(tmp_path)
    config = load_config(path, Overrides(build_dir="/b", flag_roles=("cp_size=topology",)))
    case = next(c for c in config.cases if c.name == "basic/gpt2/3")
    assert "cp_size" not in case.reference_args() and case.args["cp_size"] == 2
    assert case.assumed() == {"cp_size": "topology"}
    assert any(n.startswith("flag --cp_size") and "role 'topology' as declared by "
               "--harness-flag-role: dropped by each reference" in n for n in config.notes)
    # the config file's flag_roles does the same, and the command line wins over it
    path = _with_flag(tmp_path, flag_roles={"cp_size": "mathematics"})
    config = load_config(path, Overrides(build_dir="/b"))
    assert next(c for c in config.cases if c.name == "basic/gpt2/3").reference_args()["cp_size"] == 2
    config = load_config(path, Overrides(build_dir="/b", flag_roles=("cp_size=memory",)))
    assert "cp_size" not in next(c for c in config.cases
                                 if c.name == "basic/gpt2/3").reference_args()


@pytest.mark.parametrize("declared, message", [
    (("cp_size=sideways",), "--harness-flag-role cp_size=sideways: 'sideways' is not a role; "
                            "expected one of mathematics, topology, output, resume, memory"),
    (("cp_size",), "--harness-flag-role 'cp_size': expected NAME=ROLE"),
    (("dtype=topology",), "--harness-flag-role dtype=topology: the flag table gives --dtype the "
                          "role 'mathematics'"),
])
def test_a_declared_role_that_is_not_one_is_one_line(tmp_path, declared, message):
    path = _with_flag(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(path, Overrides(build_dir="/b", flag_roles=declared))
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_a_config_flag_roles_entry_that_is_not_a_role_names_the_file(tmp_path):
    path = _with_flag(tmp_path, flag_roles={"cp_size": "sideways"})
    with pytest.raises(ConfigError, match=r"flag_roles.*'sideways'"):
        load_config(path, BUILD)
