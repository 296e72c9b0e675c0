"""The [COMMAND] line read as gflags reads argv (gflags v2.2.2 src/gflags.cc, as
harness/logs/command_line.py cites it)."""

import pytest

from harness.logs.command_line import CommandError, command_text, parse_command

# The real line of basic/gpt2/5 (infinitrain/logs/g3025/20260710/master_8779b98), paths cut.
REAL = ("./gpt2 --input_bin data/train.bin --llmc_filepath data/gpt2_124M.bin --device cuda "
        "--dtype float32 --nthread_per_process 8 --num_iteration 10 --batch_size 40 "
        "--total_batch_size 5120 --tensor_parallel 4 --sequence_parallel true")


def test_the_real_line_is_typed_through_the_flag_table():
    c = parse_command(REAL, "gpt2_5.log")
    assert c.program == "gpt2" and c.processes == 1 and c.unknown == ()
    assert c.args == {"input_bin": "data/train.bin", "llmc_filepath": "data/gpt2_124M.bin",
                      "device": "cuda", "dtype": "float32", "nthread_per_process": 8,
                      "num_iteration": 10, "batch_size": 40, "total_batch_size": 5120,
                      "tensor_parallel": 4, "sequence_parallel": True}


@pytest.mark.parametrize("words, value, noted", [
    ("--sequence_parallel", True, False),
    ("--sequence_parallel=true", True, False),
    ("--sequence_parallel=false", False, False),
    ("--sequence_parallel true", True, False),  # `true` is a positional word
    ("--sequence_parallel false", True, True),  # still true: gflags' rule, said
    ("--nosequence_parallel", False, False),
    ("-sequence_parallel=0", False, False),
])
def test_a_boolean_flag_as_gflags_reads_it(words, value, noted):
    c = parse_command(f"./gpt2 {words} --batch_size 8", "x.log")
    assert c.args["sequence_parallel"] is value and c.args["batch_size"] == 8
    assert bool(c.notes) is noted
    if noted:
        assert "x.log: --sequence_parallel false" in c.notes[0] and "is true" in c.notes[0]


def test_a_flag_the_table_does_not_know_is_kept_as_written_and_named():
    c = parse_command("./gpt2 --allreduce_chunk_size_mb 128 --lr=1e-3", "x.log")
    assert c.args == {"allreduce_chunk_size_mb": "128", "lr": "1e-3"}
    assert c.unknown == ("allreduce_chunk_size_mb", "lr")


@pytest.mark.parametrize("line, processes, program", [
    ("./infini_run --nproc_per_node=8 ./gpt2 --tensor_parallel 8", 8, "gpt2"),
    ("tools/infini_run --nproc_per_node 4 -- ./llama3 --tensor_parallel 4", 4, "llama3"),
])
def test_a_per_group_launch_through_infini_run(line, processes, program):
    c = parse_command(line, "x.log")
    assert (c.processes, c.program, c.args["tensor_parallel"]) == (processes, program,
                                                                  processes)


def test_a_value_the_bundled_trainer_refuses_is_a_fact_of_the_run():
    assert parse_command("./gpt2 --device maca", "x.log").args["device"] == "maca"


@pytest.mark.parametrize("line, said", [
    ("./gpt2 --batch_size", "x.log: --batch_size is the last word; expected its value"),
    ("./gpt2 --batch_size ten", "x.log: --batch_size='ten': expected an integer"),
    ("./infini_run --nproc_per_node=0 ./gpt2", "expected a positive integer"),
    ("./infini_run --nproc_per_node=2", "x.log: infini_run with no program"),
    ("./gpt2 'unclosed", "x.log: [COMMAND]"),
    ("", "x.log: an empty [COMMAND] line"),
])
def test_a_line_that_cannot_be_read_says_where_and_what_was_expected(line, said):
    with pytest.raises(CommandError, match=None) as error:
        parse_command(line, "x.log")
    assert said in str(error.value)


def test_the_first_command_line_of_a_log():
    text = "[LAST_CMAKE] cmake ..\n[COMMAND] ./gpt2 --dtype float32\n[COMMAND] ./other\n"
    assert command_text(text) == "./gpt2 --dtype float32"
    assert command_text("E20260710 step 1/10 | train loss 5.0\n") is None
