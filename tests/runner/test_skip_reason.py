"""CaseRunner.skip_reason on the InfiniTrain config: flags our trainer lacks skip, a case larger
than --gpus skips, the rest run."""

from __future__ import annotations

from pathlib import Path

from harness.cases import Overrides, load_config
from tests.infinitrain_standin.build import make_build_dir

DATA = Path(__file__).resolve().parents[1] / "cases" / "data"


def test_infinitrain_only_flags_skip_on_our_trainer_and_pass_through_a_command(tmp_path):
    from harness.cases import Overrides
    from harness.runner import CaseRunner, Settings

    # InfiniTrain's config selects its binaries (BUILD_DIR); asked for our trainer explicitly
    config = load_config(DATA / "infinitrain_test_config.json", Overrides(backend="harness"))
    settings = Settings(session_id="s", session_dir=tmp_path, reference_root=tmp_path / "r",
                        lease_dir=tmp_path / "l", slots=4, device="cpu", timeout_s=10)
    runner = CaseRunner(config, settings)
    cases = {c.name: c for c in config.cases}
    assert runner.skip_reason(cases["zero/gpt2/3_zero2"]) == (
        "uses flag(s) zero_stage that the harness trainer does not implement")
    assert runner.skip_reason(cases["basic/gpt2/3"]) == (
        "needs 8 devices (dp 8 x tp 1 x pp 1), but --gpus allows 4")
    assert runner.skip_reason(cases["basic/gpt2/2"]) is None


def test_a_skipped_case_is_recorded_with_its_node_trainer_and_planned_layout(tmp_path):
    from harness.runner import CaseRunner, Settings

    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "test_config.json")
    settings = Settings(session_id="s", session_dir=tmp_path, reference_root=tmp_path / "r",
                        lease_dir=tmp_path / "l", slots=2, device="cpu", timeout_s=10)
    runner = CaseRunner(config, settings)
    case = next(c for c in config.cases if c.name == "pipeline_layout/gpt2/pp4-tp2-vpp2-uniform")
    outcome = runner.run(case, nodeid="configs/test_config.json::" + case.name)
    record = outcome.record
    assert (outcome.status, record["status"]) == ("skipped", "skipped")
    assert record["reason"] == "needs 8 devices (dp 1 x tp 2 x pp 4), but --gpus allows 2"
    assert record["nodeid"] == "configs/test_config.json::" + case.name
    assert record["trainer"] == "harness" and record["errors"] == []
    # the layout the flags ask for, although nothing ran: PP 4 x VPP 2 over GPT-2's 8 layers
    assert record["layout"]["chunks"] == [[0, 0, 1], [1, 1, 2], [2, 2, 3], [3, 3, 4],
                                          [0, 4, 5], [1, 5, 6], [2, 6, 7], [3, 7, 8]]
    assert record["parallel"] == {"pp": 4, "tp": 2, "dp": 1, "vpp": 2, "sequence_parallel": False}
    assert runner.run(case).record["nodeid"] == ""


def test_a_harness_side_error_is_an_error_and_releases_a_waiting_resume(tmp_path):
    # InfiniTrain's config without its model files: the case errors before anything launches.
    # The outcome names the case and the exception; a case that saves a checkpoint marks it
    # failed (ok: false), so a resume case waiting on it skips at once, but a marker its own
    # run already wrote is not overwritten.
    import json

    from harness.launch.infinitrain import InfiniTrainBackend
    from harness.runner import CaseRunner, Settings
    from harness.runner.checkpoints import DONE

    # (the file's GPT2_TEST_GROUPS leaves checkpoint out: named here, gpt2 runs that tag)
    config = load_config(DATA / "infinitrain_test_config.json", Overrides(
        variables={"GPT2_TEST_GROUPS": "basic,zero,checkpoint"}))
    settings = Settings(session_id="s", session_dir=tmp_path, reference_root=tmp_path / "r",
                        lease_dir=tmp_path / "l", slots=8, device="cpu", timeout_s=10)
    runner = CaseRunner(config, settings,
                        backend=InfiniTrainBackend(make_build_dir(tmp_path / "build")))
    cases = {c.name: c for c in config.cases}
    outcome = runner.run(cases["checkpoint/gpt2/ckpt_no_resume"])
    record = outcome.record
    message = (f"checkpoint/gpt2/ckpt_no_resume: FileNotFoundError: "
               f"{DATA / 'infinitrain_test_config.json'}: variable GPT2_LLMC_FILEPATH (set it with --harness-var GPT2_LLMC_FILEPATH=PATH)")
    assert (outcome.status, record["status"]) == ("error", "error")
    assert outcome.message.startswith(message) and record["errors"] == [outcome.message]
    assert record["reason"] == outcome.message.splitlines()[0]
    done = Path(runner.run_flags(cases["checkpoint/gpt2/ckpt_no_resume"])["save"]) / DONE
    assert json.loads(done.read_text()) == {"ok": False}
    done.write_text(json.dumps({"ok": True}))  # as if its run had ended well
    runner.run(cases["checkpoint/gpt2/ckpt_no_resume"])
    assert json.loads(done.read_text()) == {"ok": True}


def test_over_nodes_a_case_and_its_reference_topology_are_placed_or_skipped(tmp_path):
    import json

    from harness.launch.infinitrain import InfiniTrainBackend
    from harness.runner import CaseRunner, Settings

    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"models": ["gpt2"], "test_groups": [{"tag": "t", "tests": [
        {"id": "pp2", "args": {"pipeline_parallel": 2}},
        {"id": "pp8", "args": {"pipeline_parallel": 8}},
        {"id": "big-ref", "args": {"pipeline_parallel": 2},
         "reference": {"tensor_parallel": 8}},
        {"id": "ref4", "args": {"pipeline_parallel": 2}, "reference": {"tensor_parallel": 4}},
        {"id": "two-unknown", "args": {"zero_stage": 2, "lora_rank": 4}}]}]}))
    config = load_config(path)
    cases = {c.case_id: c for c in config.cases}

    def reason(case_id, foreign=False, slots=4, **placement):
        settings = Settings(session_id="s", session_dir=tmp_path, reference_root=tmp_path / "r",
                            lease_dir=tmp_path / "l", slots=slots, device="cpu", timeout_s=10,
                            **placement)
        backend = InfiniTrainBackend(make_build_dir(tmp_path / "build")) if foreign else None
        return CaseRunner(config, settings, backend=backend).skip_reason(cases[case_id])

    two_nodes = {"nnodes": 2, "nproc_per_node": 2}
    assert reason("pp2", **two_nodes) is None
    assert reason("pp8", **two_nodes) == "it needs 8 devices, but --gpus allows 4"
    assert reason("big-ref", **two_nodes) == \
        "its reference topology needs 8 devices, but --gpus allows 4"
    assert reason("big-ref", foreign=True, slots=8, nnodes=2, nproc_per_node=4) == (
        "its reference topology spans 2 nodes, and only the bundled trainer is launched "
        "across nodes (torchrun agents)")
    # one local machine of 4 slots
    assert reason("ref4") is None
    assert reason("big-ref") == ("its reference topology (tensor_parallel=8) needs 8 devices, "
                                 "but --gpus allows 4")
    assert reason("two-unknown") == ("uses flag(s) zero_stage, lora_rank that the harness "
                                     "trainer does not implement")
    assert reason("pp2", foreign=True, nnodes=2, nproc_per_node=1) == (
        "it spans 2 nodes, and only the bundled trainer is launched across nodes "
        "(torchrun agents)")
