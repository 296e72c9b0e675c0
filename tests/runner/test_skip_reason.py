"""CaseRunner.skip_reason on the InfiniTrain config: flags our trainer lacks skip, a case larger
than --gpus skips, the rest run."""

from __future__ import annotations

from pathlib import Path

from harness.cases import load_config

DATA = Path(__file__).resolve().parents[1] / "cases" / "data"


def test_infinitrain_only_flags_skip_on_our_trainer_and_pass_through_a_command(tmp_path):
    from harness.runner import CaseRunner, Settings

    config = load_config(DATA / "infinitrain_test_config.json")
    settings = Settings(session_id="s", session_dir=tmp_path, reference_root=tmp_path / "r",
                        lease_dir=tmp_path / "l", slots=4, device="cpu", timeout_s=10)
    runner = CaseRunner(config, settings)
    cases = {c.name: c for c in config.cases}
    assert runner.skip_reason(cases["zero/gpt2/3_zero2"]) == (
        "uses flag(s) zero_stage that the harness trainer does not implement")
    assert runner.skip_reason(cases["basic/gpt2/3"]) == (
        "needs 8 devices (dp 8 x tp 1 x pp 1), but --gpus allows 4")
    assert runner.skip_reason(cases["basic/gpt2/2"]) is None
