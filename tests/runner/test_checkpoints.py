"""Checkpoint / resume cases of a foreign trainer (harness.runner.checkpoints): re-rooting the
save / load paths under the session, and a resume case waiting for the case that saves."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from harness.runner import checkpoints
from harness.runner.checkpoints import (
    DONE,
    announce_checkpoint,
    mark_checkpoint_done,
    reroot_checkpoints,
    wait_for_checkpoint,
)

POLL = 0.01

# ------------------------------------------------------------------ reroot_checkpoints


def test_reroot_absolute_and_relative_paths(tmp_path):
    root = tmp_path / "session" / "checkpoints" / "gpt2"
    args = {"save": "/data/ckpt/run1", "load": "ckpt/run1/checkpoint_step_000030",
            "dtype": "bfloat16", "num_iteration": 50, "lora_save_path": "/data/lora",
            "my_flag": "/abs/path"}
    moved = reroot_checkpoints(args, root)
    assert moved == {"save": str(root / "data/ckpt/run1"),
                     "load": str(root / "ckpt/run1/checkpoint_step_000030"),
                     "dtype": "bfloat16", "num_iteration": 50, "lora_save_path": "/data/lora",
                     "my_flag": "/abs/path"}
    assert list(moved) == list(args)  # order kept
    assert args["save"] == "/data/ckpt/run1"  # the input is not changed


def test_reroot_keeps_a_save_and_its_load_together(tmp_path):
    root = tmp_path / "ck"
    save = reroot_checkpoints({"save": "/x/y"}, root)["save"]
    load = reroot_checkpoints({"load": "/x/y/checkpoint_step_000010"}, root)["load"]
    assert Path(load).parent == Path(save)


def test_reroot_leaves_flags_without_paths_alone(tmp_path):
    args = {"dtype": "float32", "save": "", "load": None, "save_interval": 10}
    assert reroot_checkpoints(args, tmp_path) == args
    assert reroot_checkpoints({}, tmp_path) == {}


# ------------------------------------------------------------------ mark / announce / wait


def _flags(tmp_path: Path, step: int = 30) -> tuple[dict, dict]:
    save = tmp_path / "ck" / "run1"
    return {"save": str(save)}, {"load": str(save / f"checkpoint_step_{step:06d}")}


def test_no_load_no_wait(tmp_path):
    assert wait_for_checkpoint({}, timeout_s=0) is None
    assert wait_for_checkpoint({"load": ""}, timeout_s=0) is None
    assert wait_for_checkpoint({"save": str(tmp_path / "x")}, timeout_s=0) is None


def test_loads_once_the_saver_is_done_and_the_folder_is_there(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    Path(resumer["load"]).mkdir(parents=True)
    mark_checkpoint_done(saver, ok=True)
    assert json.loads((Path(saver["save"]) / DONE).read_text()) == {"ok": True}
    assert wait_for_checkpoint(resumer, timeout_s=5, poll_s=POLL) is None


def test_done_without_announce_is_enough(tmp_path):
    saver, resumer = _flags(tmp_path)
    Path(resumer["load"]).mkdir(parents=True)
    mark_checkpoint_done(saver, ok=True)
    assert wait_for_checkpoint(resumer, timeout_s=0, poll_s=POLL) is None


def test_skip_when_the_saver_failed(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    Path(resumer["load"]).mkdir(parents=True)
    mark_checkpoint_done(saver, ok=False)
    reason = wait_for_checkpoint(resumer, timeout_s=5, poll_s=POLL)
    assert reason == (f"resumes from {resumer['load']}, but the run that saves "
                      f"{saver['save']} failed")


def test_skip_when_the_done_file_is_unreadable(tmp_path):
    saver, resumer = _flags(tmp_path)
    Path(resumer["load"]).mkdir(parents=True)
    (Path(saver["save"]) / DONE).write_text("{half")
    assert "failed" in wait_for_checkpoint(resumer, timeout_s=0, poll_s=POLL)


def test_skip_when_the_saver_did_not_write_that_step(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    mark_checkpoint_done(saver, ok=True)
    reason = wait_for_checkpoint(resumer, timeout_s=5, poll_s=POLL)
    assert reason == (f"resumes from {resumer['load']}, which the run that saves "
                      f"{saver['save']} did not write")


def test_skip_at_once_when_no_case_announced_the_save_root(tmp_path, monkeypatch):
    _, resumer = _flags(tmp_path)
    polls = []
    monkeypatch.setattr(checkpoints.time, "sleep", polls.append)  # at once: not one poll
    reason = wait_for_checkpoint(resumer, timeout_s=30, poll_s=5)
    assert polls == []
    assert reason.startswith(f"resumes from {resumer['load']}: no case of this session saved "
                             f"{tmp_path / 'ck' / 'run1'}")


def test_another_announced_root_does_not_count(tmp_path):
    _, resumer = _flags(tmp_path)
    announce_checkpoint({"save": str(tmp_path / "ck" / "run2")})
    assert "no case of this session saved" in wait_for_checkpoint(resumer, timeout_s=30,
                                                                   poll_s=5)


def test_waits_while_announced_and_not_done(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)

    def save_then_mark():
        time.sleep(0.2)
        Path(resumer["load"]).mkdir(parents=True)
        mark_checkpoint_done(saver, ok=True)

    thread = threading.Thread(target=save_then_mark)
    started = time.monotonic()
    thread.start()
    try:
        assert wait_for_checkpoint(resumer, timeout_s=10, poll_s=POLL) is None
    finally:
        thread.join()
    assert time.monotonic() - started >= 0.2  # it waited (the upper bound: benchmarks/)


def test_a_resuming_case_never_reads_a_half_written_done_file(tmp_path):
    # Planted by the code itself before: DONE was written in place, and a resuming case that
    # polled between its creation and its write read "the saver failed" (seen in CI).
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    Path(resumer["load"]).mkdir(parents=True)
    mark_checkpoint_done(saver, ok=True)
    stop = threading.Event()

    def rewrite():
        while not stop.is_set():
            mark_checkpoint_done(saver, ok=True)

    thread = threading.Thread(target=rewrite)
    thread.start()
    try:
        reasons = {wait_for_checkpoint(resumer, timeout_s=1, poll_s=POLL) for _ in range(3000)}
    finally:
        stop.set()
        thread.join()
    assert reasons == {None}


def test_waits_then_skips_when_the_saver_fails(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    timer = threading.Timer(0.2, mark_checkpoint_done, args=(saver,), kwargs={"ok": False})
    timer.start()
    try:
        reason = wait_for_checkpoint(resumer, timeout_s=10, poll_s=POLL)
    finally:
        timer.join()
    assert reason.endswith("failed")


def test_times_out_with_a_reason(tmp_path):
    saver, resumer = _flags(tmp_path)
    announce_checkpoint(saver)
    started = time.monotonic()
    reason = wait_for_checkpoint(resumer, timeout_s=0.1, poll_s=POLL)
    assert time.monotonic() - started >= 0.1  # it waited (the upper bound: benchmarks/)
    assert reason and reason.startswith(f"resumes from {resumer['load']}")
    # The saving case was announced, so the reason is the wait, not a missing case.
    assert "no case of this session" not in reason
    assert "0.1" in reason and saver["save"] in reason


def test_announce_writes_beside_the_save_root_and_ignores_no_save(tmp_path):
    saver, _ = _flags(tmp_path)
    announce_checkpoint(saver)
    announce_checkpoint(saver)  # every worker announces: idempotent
    assert (tmp_path / "ck" / "run1.planned").is_file()
    assert not Path(saver["save"]).exists()  # the saving run creates its own folder
    announce_checkpoint({"save": ""})
    announce_checkpoint({"dtype": "float32"})
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ck", "run1.planned"]


def test_mark_done_without_save_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mark_checkpoint_done({}, ok=True)
    mark_checkpoint_done({"save": ""}, ok=False)
    assert list(tmp_path.iterdir()) == []


def test_mark_done_overwrite_false_keeps_the_runs_own_verdict(tmp_path):
    saver, _ = _flags(tmp_path)
    done = Path(saver["save"]) / DONE
    mark_checkpoint_done(saver, ok=True)
    mark_checkpoint_done(saver, ok=False, overwrite=False)
    assert json.loads(done.read_text()) == {"ok": True}
    mark_checkpoint_done(saver, ok=False)  # overwrite=True by default
    assert json.loads(done.read_text()) == {"ok": False}


def test_mark_done_overwrite_false_fills_in_when_nothing_was_written(tmp_path):
    saver, _ = _flags(tmp_path)
    mark_checkpoint_done(saver, ok=False, overwrite=False)
    assert json.loads((Path(saver["save"]) / DONE).read_text()) == {"ok": False}


def test_the_whole_session_flow_with_rerooted_paths(tmp_path):
    root = tmp_path / "session" / "checkpoints" / "gpt2"
    saver = reroot_checkpoints({"save": "/ckpt/a", "save_interval": 5}, root)
    resumer = reroot_checkpoints({"load": "/ckpt/a/checkpoint_step_000005"}, root)
    announce_checkpoint(saver)
    announce_checkpoint(resumer)  # no save: nothing announced
    Path(resumer["load"]).mkdir(parents=True)
    mark_checkpoint_done(saver, ok=True)
    assert wait_for_checkpoint(resumer, timeout_s=1, poll_s=POLL) is None


# ------------------------------------------------------------------ settle_checkpoints


def _saved(root: Path, name: str) -> str:
    folder = root / name / "checkpoint_step_000010"
    folder.mkdir(parents=True)
    (folder / "model.ckpt").write_bytes(b"x")
    return str(root / name)


def test_checkpoints_go_as_the_dumps_of_passing_cases_go(tmp_path):
    from harness.runner.checkpoints import settle_checkpoints

    def session(keep: str):
        root = tmp_path / keep
        ok, resumed_from, failed = (_saved(root, n) for n in ("ok", "resumed", "failed"))
        resume_save = _saved(root, "resume")
        records = [
            {"name": "ok", "status": "passed", "flags": {"save": ok}},
            {"name": "base", "status": "passed", "flags": {"save": resumed_from}},
            {"name": "resume", "status": "failed",
             "flags": {"load": f"{resumed_from}/checkpoint_step_000010", "save": resume_save}},
            {"name": "bad", "status": "failed", "flags": {"save": failed}},
            {"name": "plain", "status": "passed", "flags": {"dtype": "float32"}},
        ]
        removed = settle_checkpoints(records, keep)
        return {Path(p).name for p in removed}, {p.name for p in root.iterdir()}

    # failed: a failed case's checkpoint stays, and so does the one a failed resume read
    assert session("failed") == ({"ok"}, {"resumed", "failed", "resume"})
    assert session("none") == ({"ok", "resumed", "failed", "resume"}, set())
    assert session("all") == (set(), {"ok", "resumed", "failed", "resume"})


def test_a_damaged_results_file_removes_no_checkpoint(tmp_path):
    from harness.runner.checkpoints import settle_session_checkpoints

    saved = _saved(tmp_path / "c", "ok")
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"name": "ok", "status": "passed", "flags": {"save": saved}})
                       + "\n" + '{"name": "cut", "status": "fai')  # a killed worker's last line
    assert settle_session_checkpoints(results, "failed") == []
    assert Path(saved).is_dir()
    results.write_text(json.dumps({"name": "ok", "status": "passed", "flags": {"save": saved}}))
    assert settle_session_checkpoints(results, "failed") == [Path(saved)]
