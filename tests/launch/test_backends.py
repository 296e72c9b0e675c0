"""harness.launch.backends: command templates become argv lists; printed step lines parse."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness.launch import CommandBackend, LaunchSpec
from harness.launch.backends import parse_step_lines


def test_command_template_builds_argv_lists(tmp_path):
    backend = CommandBackend(["{python}", "train.py", "--np={world_size}", "{flags}", "--out", "{output_dir}"],
                             version="v1")
    spec = LaunchSpec(case="t/gpt2/x", model="gpt2", flags={"pipeline_parallel": 2, "sequence_parallel": True},
                      world_size=2, checkpoint=Path("c"), input_bin=Path("i"), output_dir=Path("o d"),
                      gradients_dir=None, log_dir=tmp_path, port=1234)
    assert backend.command(spec)[1:] == ["train.py", "--np=2", "--pipeline_parallel=2",
                                         "--sequence_parallel=true", "--out", "o d"]
    with pytest.raises(ValueError, match="unknown placeholder {nprocs}"):
        CommandBackend(["run", "{nprocs}"])


def test_step_lines_parse_infinitrain_format():
    text = ("noise\nstep    1/2 | train loss 5.250158 | lr 1.00e-04 | (12.3 ms | 4150 tok/s | "
            "peak used: 123 MB | DP=1, TP=1, PP=2)\n"
            "step    2/2 | train loss nan | lr 1.00e-04 | (10.0 ms | 5000 tok/s | DP=1, TP=1, PP=2)\n")
    parsed = parse_step_lines(text)
    assert parsed[0] == {"step": 1, "loss": 5.250158, "lr": 1e-4, "step_time_ms": 12.3,
                         "tokens_per_s": 4150.0, "peak_memory_mb": 123.0,
                         "loss_resolution": 1e-6, "lr_resolution": 1e-6}
    assert np.isnan(parsed[1]["loss"]) and parsed[1]["peak_memory_mb"] is None
    assert parsed[1]["loss_resolution"] is None  # not a number: no print resolution


def _finished_run(tmp_path, stdout: str, stderr: str, world_size: int = 2, argv=("x",),
                  launcher: str | None = None):
    """A LaunchSpec and the ProcessResult of a run that exited 1 with these launcher logs."""
    from harness.launch.process import ProcessResult

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "launcher.stdout").write_text(stdout)
    (logs / "launcher.stderr").write_text(stderr)
    spec = LaunchSpec(case="c", model="gpt2", flags={}, world_size=world_size,
                      checkpoint=tmp_path / "c.bin", input_bin=tmp_path / "t.bin",
                      output_dir=tmp_path / "out", gradients_dir=None, log_dir=logs)
    return spec, ProcessResult(tuple(argv), 1, False, 1.0, logs / "launcher.stdout",
                               logs / "launcher.stderr", launcher=launcher)


def test_the_failing_rank_of_a_zygote_run_is_read_from_its_failure_record(tmp_path):
    """Data, not a regex over text forged to look like torchrun's: the stderr here says
    nothing of the rank."""
    from harness.launch.backends import HarnessBackend
    from harness.launch.zygote import read_failure, write_failure

    spec, result = _finished_run(tmp_path, "", "something went wrong\n", launcher="zygote")
    logs = spec.log_dir
    write_failure(logs, (1, -11, 4242, 10.0), [(0, 1, 4241, 11.0)])
    assert read_failure(logs)["others"][0] == {"rank": 0, "exitcode": 1, "pid": 4241, "time": 11.0}
    assert HarnessBackend().failing_rank(spec, result) == "1"
    # the record is the zygote's: a torchrun run's failure is not read from it
    assert HarnessBackend().failing_rank(spec, replace(result, launcher="torchrun")) is None
    (logs / "failure.json").write_text("{")  # unreadable: not trusted, the text is read
    assert HarnessBackend().failing_rank(spec, result) is None


def test_under_torchrun_the_rank_that_raised_first_is_the_failing_one(tmp_path):
    """A planted crash on rank 1 makes rank 0 fail milliseconds later; torchrun's summary then
    names rank 0 (whole-second timestamps, ties to the lowest rank). Each rank's own record of
    when its exception came (harness.contracts.rank_exit) decides."""
    import json

    from harness.launch.backends import HarnessBackend
    from harness.contracts.rank_exit import FAILURES_ENV, RANK_FAILURES_DIR

    spec, result = _finished_run(
        tmp_path, "", "Root Cause (first observed failure):\n[0]:\n  time      : "
        "2026-12-02_08:14:39\n  host      : vm\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 31840)\n", argv=("torchrun",))
    logs = spec.log_dir
    backend = HarnessBackend()
    assert backend.failing_rank(spec, result) == "0"  # no record: torchrun's word
    folder = Path(backend.environment(spec)[FAILURES_ENV])
    assert folder == logs / RANK_FAILURES_DIR
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(
        {"rank": 0, "time": 1796112879.207, "error": "RuntimeError: Connection closed by peer"}))
    assert backend.failing_rank(spec, result) == "0"  # named, and no record says otherwise
    (folder / "rank1.json").write_text(json.dumps(
        {"rank": 1, "time": 1796112879.204, "error": "RuntimeError: planted crash"}))
    assert backend.failing_rank(spec, result) == "1"


def test_a_rank_killed_by_a_signal_stays_the_failing_one_though_another_raised(tmp_path):
    """A SIGKILLed rank 1 writes no record; rank 0's "Connection closed" record comes after
    its death. torchrun names rank 1: the records, which cannot time a signal, do not overrule."""
    import json

    from harness.launch.backends import HarnessBackend
    from harness.contracts.rank_exit import RANK_FAILURES_DIR

    spec, result = _finished_run(
        tmp_path, "", "Root Cause (first observed failure):\n[1]:\n  rank      : 1 "
        "(local_rank: 1)\n  exitcode  : -9 (pid: 31841)\n", argv=("torchrun",))
    folder = spec.log_dir / RANK_FAILURES_DIR
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(
        {"rank": 0, "time": 1796112879.207, "error": "RuntimeError: Connection closed by peer"}))
    assert HarnessBackend().failing_rank(spec, result) == "1"


def test_a_command_trainer_s_step_lines_are_read_from_stderr_too(tmp_path):
    """InfiniTrain prints its step lines on stderr, as does a Python trainer that logs with
    `logging`: read from stdout only, such a trainer's run "recorded no steps"."""
    from harness.launch.process import ProcessResult

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "launcher.stdout").write_text("starting\n")
    (logs / "launcher.stderr").write_text(
        "INFO step    1/2 | train loss 5.250158 | lr 1.00e-04 | (12.3 ms | 4150 tok/s)\n"
        "INFO step    2/2 | train loss 5.1 | lr 1.00e-04 | (10.0 ms | 5000 tok/s)\n")
    backend = CommandBackend(["trainer"], version="v")
    spec = LaunchSpec(case="c", model="gpt2", flags={}, world_size=1,
                      checkpoint=tmp_path / "c.bin", input_bin=tmp_path / "t.bin",
                      output_dir=tmp_path / "out", gradients_dir=None, log_dir=logs)
    result = ProcessResult(("trainer",), 0, False, 1.0, logs / "launcher.stdout",
                           logs / "launcher.stderr")
    steps = backend.collect(spec, result).steps
    assert [(s["step"], s["loss"]) for s in steps] == [(1, 5.250158), (2, 5.1)]


def test_an_unavailable_backend_answers_every_question_of_the_protocol_with_its_problem():
    from harness.launch.backends import TrainerBackend
    from harness.runner.case_runner import BackendUnavailable, UnavailableBackend

    backend = UnavailableBackend("infinitrain", "no build folder /x")
    questions = [n for n in vars(TrainerBackend) if not n.startswith("_") and
                 callable(vars(TrainerBackend)[n])]
    assert len(questions) >= 12
    for name in questions:
        with pytest.raises(BackendUnavailable, match="no build folder /x"):
            getattr(backend, name)()
