"""The flag table (harness.contracts.flags): roles, the reference rule, value checks, the batch
arithmetic, argv spelling, and the bundled trainer's flags kept in sync with the table."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

import pytest

from harness.contracts import flags as F
from harness.contracts.flags import (
    BOTH,
    CHECKPOINT_PATH_FLAGS,
    DROPPED_BY_REFERENCE,
    FLAG_TABLE,
    FLAGS,
    HARNESS,
    HARNESS_FLAGS,
    INFINITRAIN,
    ROLES,
    Flag,
    FlagError,
    check_value,
    expected,
    flag_argv,
    microbatches,
    reference_args,
    role_of,
    unknown_to,
)

# ------------------------------------------------------------------ the table itself


def test_flag_names_are_unique():
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))
    assert set(FLAG_TABLE) == set(names)


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_every_flag_is_well_formed(flag):
    assert flag.role in ROLES
    assert flag.owner in ("case", "harness")
    assert flag.type in (int, float, bool, str)
    assert set(flag.trainers) <= {HARNESS, INFINITRAIN}
    assert flag.help.strip()
    assert flag.name.isidentifier() and flag.name == flag.name.lower()
    if flag.default is not None:  # the default is a value the flag accepts
        assert check_value(flag, flag.default) == flag.default
    for choice in flag.choices:
        assert check_value(flag, choice) == choice


def test_harness_flags_are_the_ones_for_the_bundled_trainer():
    assert HARNESS_FLAGS == tuple(f for f in FLAGS if HARNESS in f.trainers)


def test_input_flags_are_set_by_the_harness():
    for name in ("model", "llmc_filepath", "input_bin", "device", "dump_gradients"):
        assert FLAG_TABLE[name].owner == "harness", name


def test_checkpoint_path_flags_are_read_from_the_table():
    # The re-rooting of checkpoint folders follows the table: a checkpoint flag added to the
    # table is re-rooted without a second list to update.
    assert CHECKPOINT_PATH_FLAGS == ("save", "load")
    assert all(FLAG_TABLE[name].type is str and FLAG_TABLE[name].trainers == {INFINITRAIN}
               for name in CHECKPOINT_PATH_FLAGS)
    assert not any(flag.checkpoint_path for flag in FLAGS if flag.name not in ("save", "load"))


def test_flag_rejects_a_bad_role_or_owner():
    with pytest.raises(ValueError, match=r"flag x: role 'physics'"):
        Flag("x", int, 0, "h", "physics")
    with pytest.raises(ValueError, match=r"flag x: owner 'someone'"):
        Flag("x", int, 0, "h", "mathematics", owner="someone")


def test_roles_of_known_and_unknown_flags():
    assert role_of("dtype") == "mathematics"
    assert role_of("tensor_parallel") == "topology"
    assert role_of("nthread_per_process") == "topology"
    assert role_of("save") == "output"
    assert role_of("load") == "resume"
    assert role_of("model") == "input"
    assert role_of("my_flag") == "mathematics"  # unknown: kept


# ------------------------------------------------------------------ the reference rule


def test_reference_args_drops_topology_output_resume_keeps_mathematics_and_unknown():
    args = {"dtype": "bfloat16", "tensor_parallel": 4, "nthread_per_process": 8,
            "lora_rank": 8, "save": "x", "load": "y", "my_flag": 1}
    assert reference_args(args) == {"dtype": "bfloat16", "lora_rank": 8, "my_flag": 1}
    assert args["tensor_parallel"] == 4  # the input is not changed


def test_reference_args_drops_every_dropped_role_and_keeps_the_rest():
    args = {f.name: f.default for f in FLAGS}
    kept = reference_args(args)
    assert set(kept) == {f.name for f in FLAGS if f.role not in DROPPED_BY_REFERENCE}
    assert DROPPED_BY_REFERENCE == {"topology", "output", "resume", "memory"}


def test_reference_args_keeps_order():
    args = {"z_unknown": 1, "pipeline_parallel": 2, "batch_size": 4, "a_unknown": 2}
    assert list(reference_args(args)) == ["z_unknown", "batch_size", "a_unknown"]


def test_unknown_to():
    names = ["dtype", "optimizer", "lora_rank", "data_parallel", "mine"]
    assert unknown_to(HARNESS, names) == ["lora_rank", "data_parallel", "mine"]
    assert unknown_to(INFINITRAIN, names) == ["optimizer", "data_parallel", "mine"]


# ------------------------------------------------------------------ check_value


@pytest.mark.parametrize("name, value, typed", [
    ("batch_size", 4, 4),
    ("batch_size", "8", 8),
    ("batch_size", " 8 ", 8),
    ("learning_rate", 1, 1.0),
    ("learning_rate", "1e-3", 1e-3),
    ("learning_rate", 0, 0.0),
    ("sequence_parallel", True, True),
    ("sequence_parallel", "true", True),
    ("sequence_parallel", "False", False),
    ("sequence_parallel", "1", True),
    ("sequence_parallel", "0", False),
    ("dtype", "bfloat16", "bfloat16"),
    ("pipeline_schedule", "Interleaved1F1B", "Interleaved1F1B"),
    ("seed", -(2**63), -(2**63)),
    ("seed", 2**64 - 1, 2**64 - 1),
    ("seed", "0", 0),
    ("zero_stage", 3, 3),
    ("lora_rank", 0, 0),
    ("pipeline_layer_partition", "4,8,6,6", "4,8,6,6"),
    ("model", "gpt2", "gpt2"),
])
def test_check_value_accepts(name, value, typed):
    got = check_value(FLAG_TABLE[name], value)
    assert got == typed and type(got) is type(typed)
    assert FLAG_TABLE[name].check(value) == typed


@pytest.mark.parametrize("name, value, words", [
    ("batch_size", 0, "a positive integer"),
    ("batch_size", -1, "a positive integer"),
    ("batch_size", 1.5, "a positive integer"),
    ("batch_size", "1.5", "a positive integer"),
    ("batch_size", "x", "a positive integer"),
    ("batch_size", True, "a positive integer"),
    ("batch_size", None, "a positive integer"),
    ("num_iteration", 2.0, "a positive integer"),
    ("learning_rate", -0.1, "a finite number >= 0"),
    ("learning_rate", math.nan, "a finite number >= 0"),
    ("learning_rate", math.inf, "a finite number >= 0"),
    ("learning_rate", "inf", "a finite number >= 0"),
    ("learning_rate", "abc", "a finite number >= 0"),
    ("learning_rate", False, "a finite number >= 0"),
    ("lora_alpha", "nan", "a finite number"),
    ("sequence_parallel", "yes please", "true or false"),
    ("sequence_parallel", 1, "true or false"),
    ("sequence_parallel", None, "true or false"),
    ("dtype", "float16", "one of float32, bfloat16"),
    ("dtype", 32, "one of float32, bfloat16"),
    ("device", "tpu", "one of cpu, cuda"),
    ("pipeline_schedule", "gpipe", "one of GPipe, 1F1B"),
    ("optimizer", "adam", "one of sgd, adamw"),
    ("seed", 2**64, "an integer from -2**63 to 2**64-1"),
    ("seed", -(2**63) - 1, "an integer from -2**63 to 2**64-1"),
    ("zero_stage", 4, "an integer from 0 to 3"),
    ("zero_stage", -1, "an integer from 0 to 3"),
    ("lora_rank", "eight", "an integer"),
    ("save", 5, "a string"),
    ("load", None, "a string"),
])
def test_check_value_rejects_naming_flag_value_and_expectation(name, value, words):
    with pytest.raises(FlagError) as caught:
        check_value(FLAG_TABLE[name], value)
    message = str(caught.value)
    assert message.startswith(f"--{name}={value!r}: expected ")
    assert words in message
    assert message.endswith(expected(FLAG_TABLE[name]))


def test_flag_error_is_a_value_error():
    assert issubclass(FlagError, ValueError)


@pytest.mark.parametrize("name, words", [
    ("sequence_parallel", "true or false"),
    ("batch_size", "a positive integer"),
    ("lora_rank", "an integer"),
    ("save_interval", "an integer"),
    ("zero_stage", "an integer from 0 to 3"),
    ("seed", "an integer from -2**63 to 2**64-1"),
    ("learning_rate", "a finite number >= 0"),
    ("lora_alpha", "a finite number"),
    ("dtype", "one of float32, bfloat16"),
    ("save", "a string"),
])
def test_expected_in_words(name, words):
    assert expected(FLAG_TABLE[name]) == words


# ------------------------------------------------------------------ microbatches


@pytest.mark.parametrize("total, batch, seq, dp, micro", [
    (512, 4, 64, 1, 2),
    (256, 4, 64, 1, 1),
    (1024, 2, 32, 4, 4),
    (4096, 4, 64, 2, 8),
])
def test_microbatches(total, batch, seq, dp, micro):
    assert microbatches(total, batch, seq, dp) == micro
    assert micro * batch * seq * dp == total


def test_microbatches_error_shows_the_arithmetic():
    with pytest.raises(FlagError) as caught:
        microbatches(1000, 4, 64, 2)
    assert str(caught.value) == (
        "--total_batch_size=1000 is not a multiple of --batch_size * --sequence_length * "
        "data-parallel size = 4 * 64 * 2 = 512")


def test_microbatches_smaller_than_one_pass_is_an_error():
    with pytest.raises(FlagError, match="--total_batch_size=256 is not a multiple"):
        microbatches(256, 4, 64, 2)


# ------------------------------------------------------------------ flag_argv


def test_flag_argv_spells_booleans_true_false():
    assert flag_argv({"sequence_parallel": True, "overfit_single_batch": False, "batch_size": 4,
                      "learning_rate": 0.001, "dtype": "bfloat16", "my_flag": "a b"}) == [
        "--sequence_parallel=true", "--overfit_single_batch=false", "--batch_size=4",
        "--learning_rate=0.001", "--dtype=bfloat16", "--my_flag=a b"]


def test_flag_argv_empty_and_order():
    assert flag_argv({}) == []
    assert flag_argv({"b": 1, "a": 2}) == ["--b=1", "--a=2"]


def test_flag_argv_round_trips_through_check_value():
    args = {"sequence_parallel": True, "batch_size": 8, "learning_rate": 3e-4}
    parsed = {}
    for item in flag_argv(args):
        name, text = item[2:].split("=", 1)
        parsed[name] = check_value(FLAG_TABLE[name], text)
    assert parsed == args


# ------------------------------------------------------------------ the bundled trainer


def test_trainer_flags_fields_are_the_tables_harness_flags_with_equal_defaults():
    from harness.trainer.flags import TrainerFlags

    trainer = {f.name: f for f in fields(TrainerFlags)}
    table = {f.name: f for f in FLAGS if HARNESS in f.trainers}
    assert set(trainer) == set(table), (
        f"only in TrainerFlags: {sorted(set(trainer) - set(table))}; "
        f"only in the table: {sorted(set(table) - set(trainer))}")
    for name, field in trainer.items():
        assert field.default is not MISSING, name
        assert field.default == table[name].default, name
        assert type(field.default) is type(table[name].default), name


def test_both_is_both_trainers():
    assert BOTH == {HARNESS, INFINITRAIN}
    assert F.DTYPES == ("float32", "bfloat16")
