"""InfiniTrain's own run folders into the history: date, branch and commit from the metadata or
the folder names, tokens/s and step time over steps >= 2 as InfiniTrain-Test's writer takes
them, a log cut short said, and the real InfiniTrain-Test logs where this machine has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.history.run_folders import CONFIG, read_run_folders
from harness.history.store import append_rows, history_path, read_history

REAL = Path("/work/shared/data/infinitrain-test/infinitrain/logs/202511_a800")


def step_line(step: int, total: int, loss: float, ms: float, tps: int, peak: int | None = None,
              day: str = "20251127") -> str:
    memory = f" | peak used: {peak:5d} MB | peak reserved: {peak + 10:5d} MB" if peak else ""
    return (f"E{day} 07:51:{10 + step:02d}.145181 140071820840960 main.cc:325] step "
            f"{step:4d}/{total} | train loss {loss:.6f} | lr 1.00e-04 | ({ms:.2f} ms | "
            f"{tps} tok/s{memory}, DP=1, TP=1, SP=0, PP=1)")


def write_log(path: Path, steps: int = 4, total: int = 4, peak: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["[LAST_CMAKE] cmake -DUSE_CUDA=ON -DUSE_NCCL=ON .. && make -j",
             "[COMMAND] ./gpt2 --device cuda"]
    lines += [step_line(s, total, 5.5 - 0.1 * s, 70.0 if s == 1 else 25.0 + s,
                        3000 if s == 1 else 9000 + 100 * s, peak) for s in range(1, steps + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_flat_run_folder_takes_its_date_from_the_log_and_branch_and_commit_from_its_name(
        tmp_path):
    run = tmp_path / "202511_a800" / "20251127" / "master_e7d57db"
    write_log(run / "logs" / "gpt2_1.log")
    write_log(run / "logs" / "build_1.log").write_text("[ 10%] Building CXX object\n")
    write_log(run / "logs" / "gpt2_1_profile.log")
    rows, notes = read_run_folders([tmp_path])
    assert notes == []  # the build log and the profile are no runs
    (r,) = rows
    assert (r.name, r.status, r.branch, r.commit) == ("untagged/gpt2/1", "ran", "master",
                                                       "e7d57db")
    assert (r.session, r.machine, r.config) == ("202511_a800/20251127/master_e7d57db",
                                                "202511_a800", CONFIG)
    assert r.date == "2025-11-27T07:51:11"  # the first step line's glog time
    assert r.tokens_per_s == pytest.approx((9200 + 9300 + 9400) / 3)  # steps >= 2
    assert r.step_ms == pytest.approx((27 + 28 + 29) / 3)
    assert (r.last_loss, r.last_step, r.peak_memory_mb) == (pytest.approx(5.1), 4, None)
    assert r.source == "run-folder" and r.loss_margin is None


def test_a_tagged_run_folder_takes_its_facts_from_run_metadata(tmp_path):
    run = tmp_path / "h800" / "20251201" / "e7d57db_master"  # the older order, sha first
    write_log(run / "logs" / "basic" / "llama3_1.log", peak=5120)
    (run / "logs" / "run_metadata.log").write_text(
        "[RUN_STARTED_AT] 2025-12-01T02:00:00+08:00\n[GIT_BRANCH] fix_cub\n"
        "[GIT_COMMIT] 54b818d0123456789\n[CONFIG_FILE] scripts/test_config.json\n")
    (r,) = read_run_folders([run])[0]
    assert (r.name, r.branch, r.commit, r.config) == ("basic/llama3/1", "fix_cub",
                                                      "54b818d0123456789",
                                                      "scripts/test_config.json")
    assert r.date == "2025-12-01T02:00:00+08:00"
    assert r.peak_memory_mb == 5120  # peak used, as the harness records InfiniTrain's memory


def test_a_log_cut_short_is_an_error_row_and_a_log_without_steps_is_said(tmp_path):
    run = tmp_path / "m" / "20251127" / "master_e7d57db"
    write_log(run / "logs" / "gpt2_1.log", steps=2, total=10)
    (run / "logs" / "llama3_1.log").write_text("[COMMAND] ./llama3\nSegmentation fault\n")
    rows, notes = read_run_folders([tmp_path])
    (r,) = rows
    assert (r.status, r.reason) == ("error", "the log stops at step 2 of 10")
    assert len(notes) == 1 and "llama3_1.log" in notes[0]
    assert read_run_folders([tmp_path / "nowhere"])[1] == [
        f"{tmp_path / 'nowhere'}: no such folder; expected an InfiniTrain run folder"]


def test_importing_the_same_run_folder_twice_adds_nothing(tmp_path):
    run = tmp_path / "m" / "20251127" / "master_e7d57db"
    write_log(run / "logs" / "gpt2_1.log")
    path = history_path(tmp_path / "out")
    assert append_rows(path, read_run_folders([tmp_path])[0]) == 1
    assert append_rows(path, read_run_folders([tmp_path])[0]) == 0
    assert len(read_history(path).rows) == 1


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the real InfiniTrain-Test logs are not here "
                                              f"({REAL})")
def test_the_real_infinitrain_test_run_folder():
    rows, notes = read_run_folders([REAL])
    assert notes == []
    by = {r.name: r for r in rows}
    assert set(by) == {f"untagged/{n}" for n in ("gpt2/1", "gpt2/1_bfloat16", "gpt2/2",
                                                 "gpt2/3", "llama3/1", "llama3/1_bfloat16",
                                                 "llama3/3")}
    gpt2 = by["untagged/gpt2/1"]
    assert (gpt2.commit, gpt2.branch, gpt2.machine) == ("e7d57db", "master", "202511_a800")
    assert {r.date for r in rows} == {"2025-11-27T07:51:43"}  # one night: the first log's time
    assert gpt2.last_loss == pytest.approx(5.271437) and gpt2.last_step == 10
    assert 8000 < gpt2.tokens_per_s < 10500  # steps 2-10 of the log: 9281, ..., 9077 tok/s


NIGHTS = Path(__file__).parents[1] / "logs" / "fixtures" / "nights"  # real nights (README there)


def test_a_nights_self_check_verdicts_land_in_the_history(tmp_path):
    rows, notes = read_run_folders([NIGHTS])
    assert notes == []
    by = {(r.machine, r.name): r for r in rows}
    sp = by[("g3025", "basic/gpt2/5")]
    assert (sp.status, sp.self_check) == ("failed", "failed")
    assert sp.loss_margin == pytest.approx(1 / 95, rel=0.05)  # threshold / worst
    assert "first diverging step 2" in sp.reason
    dp = by[("maca_c550_49", "basic/gpt2/4")]
    assert dp.status == "passed" and dp.loss_margin > 1
    assert by[("g3025", "basic/gpt2/2")].status == "ran"  # the reference itself: no verdict
    history = history_path(tmp_path)
    append_rows(history, rows)
    kept = {(r.machine, r.name): r.status for r in read_history(history).rows}
    assert kept[("maca_c550_49", "basic/gpt2/8")] == "failed"


def test_a_case_that_breaks_at_a_build_is_a_finding_of_the_history(tmp_path):
    from harness.history.findings import status_changes
    from tests.logs.nightly_logs import DP8, ONE, TP4_SP, night, off_from, write_log
    for day, build, off in (("20260701", "master_aaaaaaa", 1e-6),
                            ("20260702", "master_bbbbbbb", 1e-6),
                            ("20260703", "master_ccccccc", 7e-4),
                            ("20260704", "master_ddddddd", 7e-4)):
        run = night(tmp_path, day=day, build=build)
        write_log(run, "2", ONE, day=day)
        write_log(run, "3", DP8, day=day)
        write_log(run, "5", TP4_SP, losses=off_from(2, off), day=day)
    rows, _ = read_run_folders([tmp_path])
    (found,) = [f for f in status_changes(rows) if f.name == "basic/gpt2/5"]
    assert found.kind == "broke" and "broke at build ccccccc" in found.text, found.line
    assert found.row.date.startswith("2026-07-03")
