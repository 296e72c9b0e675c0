"""harness.contracts.programs: InfiniTrain's programs as facts with their source lines, and which
program runs which tag as InfiniTrain's own runner decides."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.contracts.flags import FLAG_TABLE, FLAGS, INFINITRAIN, foreign_role_table
from harness.contracts.models import MODEL_SPECS
from harness.contracts.programs import (
    FACT_NAMES,
    LAUNCHER_PROCESSES,
    PROGRAMS,
    RUNNER,
    RUNNER_FACTS,
    ProgramFactsError,
    parse_groups,
    plan_tags,
    program_table,
    read_programs,
    read_runner,
)

# a branch of the fetched repository at its commit, or `later@` a stored later file version
# (its commit, or `id` and the stored id: infinitrain_programs.json's $comment)
SOURCE = re.compile(r"^(master|feat/[\w.-]+|later)@([0-9a-f]{7}|id\d+):\S+:\d+")


def test_every_program_has_every_fact_with_its_source_line():
    assert set(PROGRAMS) == {"gpt2", "llama3", "tiny_mixtral", "qwen3", "mixtral"}
    for program in PROGRAMS.values():
        assert [fact for fact, _ in program.sources][:len(FACT_NAMES)] == list(FACT_NAMES)
        for fact, source in program.sources:
            if fact != "family":  # the bundled trainer's side names its own module
                assert SOURCE.match(source), (program.name, fact, source)


def test_the_facts_that_decide_a_run():
    mixtral = PROGRAMS["tiny_mixtral"]
    assert (mixtral.binary, mixtral.checkpoint_variable, mixtral.input_bin_variable) == (
        "tiny_mixtral", "MIXTRAL_LLMC_FILEPATH", "MIXTRAL_INPUT_BIN")
    assert mixtral.step_line == "stdout" and not mixtral.multi_device
    assert mixtral.family == "mixtral" and mixtral.default_groups == "moe"
    # every family a program names is one of the bundled trainer's (harness.contracts.models)
    assert {p.family for p in PROGRAMS.values()} <= set(MODEL_SPECS)
    assert not mixtral.runs_every_tag_without_groups
    assert PROGRAMS["gpt2"].step_line == "glog" and PROGRAMS["gpt2"].multi_device
    # every batch flag a program names is in the flag table, as InfiniTrain's
    for program in PROGRAMS.values():
        assert all(INFINITRAIN in FLAG_TABLE[f].trainers for f in program.batch_flags)
        # its microbatch flag is one of them, and every default is a value the table types
        assert program.microbatch_flag in program.batch_flags
        for name, value in program.defaults.items():
            assert FLAG_TABLE[name].check(value) == value, (program.name, name)
    assert PROGRAMS["llama3"].defaults["learning_rate"] == 1e-5  # llama3/main.cc:62
    assert PROGRAMS["gpt2"].defaults["total_batch_size"] == 256  # gpt2/main.cc:57


def _doc(**change):
    entry = json.loads(json.dumps({
        "name": "x", **{fact: {"value": value, "source": "feat/x@abcdef0:a.cc:1"} for fact, value
                        in (("binary", "x"), ("variable_prefix", "X"),
                            ("groups_variable", "X_TEST_GROUPS"), ("default_groups", "a"),
                            ("runs_every_tag_without_groups", False), ("step_line", "glog"),
                            ("batch_flags", ["batch_size"]), ("multi_device", False),
                            ("family", None), ("defaults", {"batch_size": 4}),
                            ("microbatch_flag", "batch_size"))}}))
    entry.update(change)
    return json.dumps({"runner": _runner(), "programs": [entry]})


def _runner(**change) -> dict:
    values = {"group_launch_keys": [LAUNCHER_PROCESSES], "exported_variables": "all",
              "device_variable": "DEVICE_BACKEND", "device_default": "cuda",
              "config_option": "--test-config"}
    return {fact: {"value": value, "source": "later@id1:r.bash:1"}
            for fact, value in {**values, **change}.items()}


def test_the_runner_facts_each_with_its_source_line():
    """What the newer runner reads beyond the programs: the one infini_run_args key, the device
    word's variable and default, its config option; each from the runner's own line."""
    assert RUNNER.group_launch_keys == (LAUNCHER_PROCESSES,) == ("nproc_per_node",)
    assert (RUNNER.device_variable, RUNNER.device_default) == ("DEVICE_BACKEND", "cuda")
    assert RUNNER.config_option == "--test-config"
    assert [fact for fact, _ in RUNNER.sources] == list(RUNNER_FACTS)
    for fact, source in RUNNER.sources:
        assert SOURCE.match(source.replace("fix_muxi_device_registry@", "feat/fix_muxi@")), source
    # the per-program shell variable: gpt2 and llama3 only (the runner sets it for those two)
    assert {name: p.shell_variables for name, p in PROGRAMS.items() if p.shell_variables} == {
        "gpt2": {"LORA_WEIGHTS_DIR": "GPT2_LORA_WEIGHTS_DIR"},
        "llama3": {"LORA_WEIGHTS_DIR": "LLAMA3_LORA_WEIGHTS_DIR"}}


def test_a_runner_key_whose_meaning_the_harness_lacks_is_refused():
    data = json.loads(_doc())
    data["runner"] = _runner(group_launch_keys=[LAUNCHER_PROCESSES, "nnodes"])
    text = json.dumps(data)
    read_programs(text)  # the shape is right ...
    with pytest.raises(ProgramFactsError, match="names nnodes; the harness knows what "
                                                "nproc_per_node means"):
        read_runner(text, "facts.json")  # ... but nnodes would be read as nothing


def test_a_valid_document_reads():
    assert read_programs(_doc())["x"].groups_variable == "X_TEST_GROUPS"


@pytest.mark.parametrize("change, message", [
    ({"colour": {"value": 1, "source": "s"}}, "programs/0: Additional properties"),
    ({"step_line": {"value": "printf", "source": "s"}}, "programs/0/step_line/value: 'printf'"),
    ({"binary": {"value": "x"}}, "programs/0/binary: 'source' is a required property"),
])
def test_a_bad_document_is_one_line_naming_the_entry(change, message):
    with pytest.raises(ProgramFactsError) as error:
        read_programs(_doc(**change), "facts.json")
    assert str(error.value).startswith("facts.json: ") and message in str(error.value)


def test_a_program_listed_twice_is_refused():
    data = json.loads(_doc())
    data["programs"] *= 2
    with pytest.raises(ProgramFactsError, match="program 'x' is listed twice"):
        read_programs(json.dumps(data))


def test_groups_are_read_as_the_runner_reads_them():
    assert parse_groups(" basic, zero ,,moe ") == ("basic", "zero", "moe")
    assert parse_groups("") == ()


def test_without_any_groups_variable_gpt2_and_llama3_run_every_tag():
    plan = plan_tags(("basic", "recompute"), {"BUILD_DIR": "../build"}, "c.json")
    assert plan.programs_by_tag == {"basic": ("gpt2", "llama3"), "recompute": ("gpt2", "llama3")}
    assert plan.notes == ()


def test_with_groups_variables_each_program_runs_its_own_and_defaults_fill_in():
    plan = plan_tags(("basic", "zero", "lora", "checkpoint", "moe"),
                     {"LLAMA3_TEST_GROUPS": "zero"}, "c.json")
    assert plan.programs_by_tag == {"basic": ("gpt2",), "zero": ("gpt2", "llama3"),
                                    "lora": ("gpt2",), "checkpoint": ("gpt2",),
                                    "moe": ("tiny_mixtral",)}


DOCS = Path(__file__).resolve().parents[2] / "docs" / "infinitrain_branches.md"
MIRROR = Path("/work/.mirror/InfiniTensor+InfiniTrain/repo")


def test_the_docs_table_every_program_fact_and_every_infinitrain_flag_role():
    text = DOCS.read_text()
    missing = [line for line in program_table() + foreign_role_table() if line not in text]
    assert not missing, missing[:3]


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no fetched InfiniTrain mirror at {MIRROR}")
def test_every_flag_source_line_names_its_flag_in_infinitrains_source():
    """Where the fetched repository is here (not in CI): each `main.cc:N` a flag cites holds the
    flag's DEFINE (or its continuation line) on that branch."""
    wrong = []
    for flag in FLAGS:
        match = re.match(r"([\w/.-]+)@\w+:", flag.source)
        if not match or "#209" in flag.source:
            continue
        for path, line in re.findall(r"(example/\w+/main\.cc):(\d+)", flag.source):
            text = subprocess.run(["git", "-C", str(MIRROR), "show", f"{match[1]}:{path}"],
                                  capture_output=True, text=True, check=True).stdout
            lines = text.splitlines()[int(line) - 1:int(line) + 1]
            if not any(flag.name in item for item in lines):
                wrong.append((flag.name, match[1], path, line))
    assert not wrong
