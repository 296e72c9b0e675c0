import pytest

from harness.trainer.flags import FlagError, TrainerFlags, check_batch_arithmetic, parse_flags


def test_infinitrain_names_and_dash_forms_parse_to_the_same_flags():
    underscored = parse_flags(
        ["--batch_size", "2", "--sequence_length", "16", "--total_batch_size", "128",
         "--pipeline_layer_partition", "3,5", "--pipeline_parallel", "2"]
    )
    dashed = parse_flags(
        ["--batch-size=2", "--sequence-length=16", "--total-batch-size=128",
         "--pipeline-layer-partition=3,5", "--pipeline-parallel=2"]
    )
    assert underscored == dashed
    assert underscored.batch_size == 2 and underscored.pipeline_layer_partition == "3,5"


@pytest.mark.parametrize(
    "argv, expected",
    [([], False), (["--sequence_parallel"], True), (["--sequence_parallel=false"], False),
     (["--sequence_parallel=true"], True), (["--sequence-parallel", "1"], True)],
)
def test_boolean_flags_accept_gflags_spellings(argv, expected):
    assert parse_flags(argv).sequence_parallel is expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag"),
        (["--batch_size", "0"], "--batch_size"),
        (["--batch_size", "two"], "expected a positive integer, got 'two'"),
        (["--dtype", "float16"], "invalid choice: 'float16'"),
        (["--pipeline_schedule", "Zigzag"], "invalid choice: 'Zigzag'"),
        (["--learning_rate", "nan"], "expected a finite number >= 0, got 'nan'"),
        (["--sequence_parallel=maybe"], "expected true or false, got 'maybe'"),
        (["--batch"], "unrecognized arguments: --batch"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_flags(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_total_batch_size_must_divide_by_microbatch_tokens_times_dp():
    flags = TrainerFlags(batch_size=2, sequence_length=16, total_batch_size=128)
    assert check_batch_arithmetic(flags, data_parallel=1) == 4
    assert check_batch_arithmetic(flags, data_parallel=2) == 2
    with pytest.raises(FlagError, match=r"--total_batch_size=128 is not a multiple of .* = 2 \* 16 \* 3 = 96"):
        check_batch_arithmetic(flags, data_parallel=3)


def test_total_batch_size_defaults_to_one_microbatch():
    flags = TrainerFlags(batch_size=3, sequence_length=8)
    assert flags.step_tokens == 24
    assert check_batch_arithmetic(flags, data_parallel=1) == 1


def test_help_shows_every_flags_default(capsys):
    with pytest.raises(SystemExit):
        parse_flags(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "sequences per microbatch on each data-parallel rank (default: 4)" in text
    assert "(default: float32)" in text and "(default: sgd)" in text
