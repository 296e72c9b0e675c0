"""Fuzzed trainer flags through harness.trainer.main.main(argv), in process, on the tiny
synthetic assets: every argv either trains or exits with code 2 and a one-line "error: ..."
naming the flag; never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.trainer import main as trainer_main

VALUES = {
    "batch_size": ["1", "2", "0", "-1", "x", "1.5", "", "100000", "99999999999999999999"],
    "sequence_length": ["4", "8", "0", "65", "1000000", "-3", "eight"],
    "total_batch_size": ["8", "16", "24", "7", "0", "3"],
    "num_iteration": ["1", "0", "-1", "one"],
    "learning_rate": ["0", "1e-3", "-1", "nan", "inf", "abc", "1e400"],
    "weight_decay": ["0", "0.1", "-0.5", "nan"],
    "seed": ["0", "-1", "42", str(2**64 - 1), str(2**64), str(-(2**63) - 1), "1e3", "x"],
    "tensor_parallel": ["1", "2", "0", "3"],
    "pipeline_parallel": ["1", "2", "0", "3"],
    "virtual_pipeline_parallel": ["1", "2", "0"],
    "pipeline_layer_partition": ["4,4", "8", "3,5", "0,8", "4,x", ""],
    "pipeline_layer_costs": ["1x8", "1x8,L:4.5", "1,1", "nanx8", ""],
    "pipeline_chunk_layout": ["0:8", "0:4,1:4", "0:3,1:3,1:1,0:1", "0:x", ""],
    "pipeline_model_parallel_layout": ["Et*8NL", "Et*4|t*4NL", "Et*3|t*5L", "t*8", "Em|NL", ""],
    "pipeline_schedule": ["GPipe", "1F1B", "Interleaved1F1B", "Nope"],
    "dtype": ["float32", "bfloat16", "float16"],
    "optimizer": ["sgd", "adamw", "adam"],
    "model": ["gpt2", "llama3", "gpt3"],
    "device": ["cpu", "tpu"],
    "sequence_parallel": ["true", "false", "maybe"],
}
UNKNOWN = ["--batch_sise=2", "--pipeline_parallel", "--no_such_flag", "positional", "--"]


@st.composite
def argvs(draw, values=VALUES):
    chosen = draw(st.lists(st.sampled_from(sorted(values)), max_size=5, unique=True))
    argv = []
    for name in chosen:
        spelling = name.replace("_", "-") if draw(st.booleans()) else name
        argv.append(f"--{spelling}={draw(st.sampled_from(values[name]))}")
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(UNKNOWN)))
    return argv


def run_main(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = trainer_main.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def check_verdict(code, err):
    if code == 0:
        return
    assert code == 2, (code, err)
    last = err.strip().splitlines()[-1]
    assert "error: " in last, err
    if last.startswith("error: "):  # main's own checks print exactly one line
        assert len(err.strip().splitlines()) == 1, err
        assert "--" in last or "/" in last, last  # names the flag (or the file)


@pytest.fixture
def files(tiny_assets, model="gpt2"):
    return [f"--llmc_filepath={tiny_assets.checkpoint(model)}",
            f"--input_bin={tiny_assets.tokens(model, 'train')}"]


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=argvs())
def test_fuzzed_flags_pass_every_check_or_exit_2_with_one_line(files, argv, capsys, monkeypatch,
                                                               tmp_path):
    """main's checks only: training itself is replaced (the real run is the next test)."""
    trained = []
    monkeypatch.setattr(trainer_main, "_train", lambda *a, **k: trained.append(a) or 0)
    monkeypatch.setenv("WORLD_SIZE", "1")
    code, err = run_main([*files, f"--output_dir={tmp_path}", *argv], capsys)
    check_verdict(code, err)
    assert bool(trained) == (code == 0)


SMALL = {  # values that keep a real run to a fraction of a second
    "batch_size": ["1", "2", "0", "100000"], "sequence_length": ["4", "8", "65"],
    "total_batch_size": ["8", "16", "7"], "learning_rate": ["0", "1e-3", "nan"],
    "seed": ["0", "-1", str(2**64 - 1), str(2**64)], "dtype": ["float32", "bfloat16"],
    "optimizer": ["sgd", "adamw"], "pipeline_parallel": ["1", "2"],
    "pipeline_model_parallel_layout": ["Et*8NL", "Et*4|t*4NL", "t*8"],
}


@pytest.mark.slow
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=argvs(SMALL))
# Found by this test: both trained past main's checks, then died with a traceback.
@example(argv=["--batch_size=100000"])  # more tokens per microbatch than the file holds
@example(argv=[f"--seed={2**64}"])  # beyond what torch.manual_seed takes
def test_fuzzed_flags_through_a_real_run(files, argv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    code, err = run_main([*files, "--num_iteration=1", "--batch_size=1", "--sequence_length=4",
                          f"--output_dir={tmp_path}", *argv], capsys)
    check_verdict(code, err)
    if code == 0:
        assert (tmp_path / "steps.jsonl").is_file()
