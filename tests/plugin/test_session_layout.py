"""Unit tests (no torch, no pytest run) of the session header's facts and file, the case-name
filter the xdist controller uses, the layout a record carries before any run (skipped cases),
`parallel.vpp` taken from it, and the rank logs of a single-process run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness.cases import load_config
from harness.launch import LaunchSpec
from harness.launch.process import ProcessResult
from harness.cases.node_ids import case_names
from harness.results import SESSION_FORMAT, read_header, write_header
from harness.results.session import driver_version, git_facts, new_header
from harness.runner import CaseRunner, Settings
from harness.runner.stages import rank_logs


def test_git_facts_outside_and_inside_a_work_tree(tmp_path):
    assert git_facts(tmp_path) == (None, None)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a").write_text("a")
    subprocess.run([*git, "add", "a"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "a"], cwd=tmp_path, check=True)
    commit, dirty = git_facts(tmp_path)
    assert len(commit) == 40 and dirty is False
    (tmp_path / "b").write_text("b")
    assert git_facts(tmp_path) == (commit, True)


def test_driver_from_nvidia_smi_when_there_is_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert driver_version() is None  # no nvidia-smi: a CPU machine
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\n"
                   "printf '550.54.15\\n550.54.15\\n'\n")
    smi.chmod(0o755)
    assert driver_version() == "550.54.15"  # one value for a machine of equal GPUs
    assert (tmp_path / "argv").read_text().split() == [
        "--query-gpu=driver_version", "--format=csv,noheader"]
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert driver_version() is None


def test_header_round_trip_and_fields(tmp_path):
    header = new_header("20260101-000000-1", "2026-01-01T00:00:00+0000", tmp_path / "c.json",
                        tmp_path, ["-k", "gpt2"])
    assert header["format"] == SESSION_FORMAT and header["finished_at"] is None
    assert header["git_commit"] is None and header["collected"] == []
    assert header["args"] == ["-k", "gpt2"] and header["config_path"].endswith("c.json")
    header["collected"] = ["basic/gpt2/pp2"]
    path = write_header(tmp_path / "s", header)
    assert path.name == "session.json" and read_header(path.parent) == header
    assert [p.name for p in path.parent.iterdir()] == ["session.json"]  # no temporary left
    try:
        write_header(tmp_path / "s", {**header, "bogus": 1})
    except ValueError as error:
        assert "bogus" in str(error)
    else:
        raise AssertionError("an unknown header field was written")


def test_case_names_from_xdist_node_ids():
    ids = ["configs/test_config.json::basic/gpt2/pp2", "tests/test_x.py::test_y",
           "other.json::basic/gpt2/pp2", "configs/test_config.json::basic/llama3/pp2-vpp2"]
    assert case_names(ids, Path("/repo/configs/test_config.json")) == [
        "basic/gpt2/pp2", "basic/llama3/pp2-vpp2"]
    # A config outside the rootdir (InfiniTrain's, beside its build): pytest's ids start "::".
    assert case_names(["::basic/gpt2/1", "::basic/gpt2", "t.py::a/b/c::d"],
                      Path("/elsewhere/test_config.json")) == ["basic/gpt2/1"]


def _runner(tmp_path, args, slots=1):
    config = tmp_path / "cases.json"
    group = {"tag": "t", "tests": [{"id": "c", "args": args}]}
    config.write_text(json.dumps({"models": ["gpt2"], "assets": {"dir": str(tmp_path / "assets")},
                                  "test_groups": [group]}))
    loaded = load_config(config)
    settings = Settings(session_id="s", session_dir=tmp_path / "s", reference_root=tmp_path / "r",
                        lease_dir=tmp_path / "l", slots=slots, device="cpu", timeout_s=5)
    return CaseRunner(loaded, settings), loaded.cases[0]


def test_a_skipped_case_records_its_layout_and_the_layouts_vpp(tmp_path):
    runner, case = _runner(tmp_path, {"pipeline_parallel": 2,
                                      "pipeline_model_parallel_layout": "Et*3|t*2||t*3NL"})
    outcome = runner.run(case, "cases.json::t/gpt2/c")
    record = outcome.record
    assert record["status"] == "skipped"
    assert record["layout"]["chunks"] == [[0, 0, 3], [1, 3, 5], [0, 5, 5], [1, 5, 8]]
    assert record["parallel"]["vpp"] == 2  # from the Megatron string, no vpp flag given
    assert not (tmp_path / "assets").exists()  # the preset gave the depth: nothing generated
    runner, case = _runner(tmp_path, {"pipeline_parallel": 2, "pipeline_layer_partition": "9,9"})
    record = runner.run(case).record  # flags that do not resolve: no layout, vpp as asked
    assert record["layout"] is None and record["parallel"]["vpp"] == 1


def test_a_single_process_run_has_its_output_as_rank_0_logs(tmp_path):
    runner, case = _runner(tmp_path, {})
    spec = LaunchSpec(case=case.name, model="gpt2", flags={}, world_size=1, checkpoint=Path("c"),
                      input_bin=Path("i"), output_dir=tmp_path / "o", gradients_dir=None,
                      log_dir=tmp_path / "o" / "logs")
    spec.log_dir.mkdir(parents=True)
    out, err = spec.log_dir / "launcher.stdout", spec.log_dir / "launcher.stderr"
    out.write_text("step 1\n")
    err.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    result = ProcessResult(("python",), 1, False, 0.1, out, err)
    assert rank_logs(runner.backend, spec, result) == {"0": [out, err]}
    text = runner._crash_text(case, spec, result, "0", rank_logs(runner.backend, spec, result))
    assert "--- rank 0: " in text and text.endswith("RuntimeError: boom")
    # torchrun's per-rank files: stdout before stderr, so the tail ends with the traceback.
    ranks = spec.log_dir / "ranks" / "none_x" / "attempt_0"
    for rank in ("0", "1"):
        (ranks / rank).mkdir(parents=True)
        for name in ("stderr.log", "stdout.log"):
            (ranks / rank / name).write_text(name)
    spec.world_size = 2
    logs = rank_logs(runner.backend, spec, result)
    assert {r: [p.name for p in ps] for r, ps in logs.items()} == {
        "0": ["stdout.log", "stderr.log"], "1": ["stdout.log", "stderr.log"]}
