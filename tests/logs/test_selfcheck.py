"""`python -m harness.logs RUNS`: recorded run folders judged on their own, each case against the
recorded one-device run of its mathematics, and the archive followed night by night. Planted
divergences in logs of the real shape (the glog prefix, the [COMMAND] and metadata lines, the
step line's placement fields) that tests/logs/test_selfcheck_real.py checks on real nights."""

import json
from pathlib import Path

import pytest

from harness.logs.cli import main
from harness.logs.readers import read_paths
from harness.logs.archive import judge_reading
from harness.logs.selfcheck import (
    BAD,
    FAILED,
    NO_REFERENCE,
    NOT_JUDGED,
    PASSED,
    REFERENCE,
    first_update_note,
)

from .nightly_logs import BASE, DP8, LOSSES, ONE, PP4_VPP2, TP4_SP, night, off_from, write_log

def judged(root: Path, **kw):
    return {r.label: r for r in judge_reading(read_paths([root]), **kw)}


def test_a_case_off_from_step_2_fails_there_and_its_update_is_named(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8, losses=off_from(1, 2e-6))
    write_log(run, "5", TP4_SP, losses=off_from(2, 7.3e-4))
    rows = judged(tmp_path)
    assert rows["basic/gpt2/2"].status == REFERENCE
    assert rows["basic/gpt2/3"].status == PASSED
    bad = rows["basic/gpt2/5"]
    assert bad.status == FAILED and bad.verdict.first_diverging_step == 2
    assert bad.reference.label == "basic/gpt2/2" and bad.one_device
    assert bad.topology_difference == "DP 2 × TP 4 + SP against one device"
    line = bad.line()
    assert "first diverging step 2: run 5.111682 baseline 5.110952" in line
    assert "step 1 agrees" in line and "the update after step 1 differs" in line
    # the worst |diff| over the step's limit: the same offset weighs most at the lowest loss
    assert bad.worst_ratio == pytest.approx(max(7.3e-4 / (1e-5 * x) for x in LOSSES[1:]),
                                            rel=1e-2)


def test_the_update_is_named_only_where_step_1_agrees(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "5", TP4_SP, losses=off_from(1, 7.3e-4))
    bad = judged(tmp_path)["basic/gpt2/5"]
    assert bad.status == FAILED and bad.verdict.first_diverging_step == 1
    assert first_update_note(bad.verdict) is None and "update" not in bad.line()


def test_without_a_one_device_run_the_least_parallel_stands_in_and_every_line_says_so(tmp_path):
    run = night(tmp_path)
    write_log(run, "3", DP8)
    write_log(run, "5", TP4_SP, losses=off_from(2, 7.3e-4))
    write_log(run, "7", PP4_VPP2, losses=off_from(1, 3e-6))
    rows = judged(tmp_path)
    # PP 4 x VPP 2 runs on 4 devices, DP 8 on 8: the fewest devices stand in
    assert rows["basic/gpt2/7"].status == REFERENCE
    assert "the least-parallel run, standing in" in rows["basic/gpt2/7"].line()
    for label in ("basic/gpt2/3", "basic/gpt2/5"):
        row = rows[label]
        assert row.reference.label == "basic/gpt2/7" and not row.one_device
        assert ("no one-device run of this mathematics in the folder; compared with "
                "basic/gpt2/7, PP 4 × VPP 2") in row.line()
    assert rows["basic/gpt2/3"].status == PASSED and rows["basic/gpt2/5"].status == FAILED


def test_a_one_device_run_of_exactly_the_same_mathematics_comes_first(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)  # batch 80: the same step, another microbatch split
    write_log(run, "2b", BASE + " --batch_size 10 --total_batch_size 5120",
              losses=off_from(1, 1e-6))  # batch 10, one device: the DP case's exact reference
    write_log(run, "3", DP8)
    rows = judged(tmp_path)
    assert rows["basic/gpt2/3"].reference.label == "basic/gpt2/2b"
    # the second one-device run of the step is judged against the first
    assert rows["basic/gpt2/2b"].status == PASSED
    assert rows["basic/gpt2/2b"].reference.label == "basic/gpt2/2"


def test_other_mathematics_is_never_a_reference(tmp_path):
    run = night(tmp_path)
    write_log(run, "1", BASE)  # the defaults: 256 tokens a step
    write_log(run, "3", DP8)
    write_log(run, "6", DP8 + " --learning_rate 0.001")
    rows = judged(tmp_path)
    assert {r.status for r in rows.values()} == {NO_REFERENCE}
    assert "the only run of its mathematics in the folder (DP 8)" in rows["basic/gpt2/3"].why


def test_a_log_cut_short_fails_with_its_missing_steps(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8, losses=LOSSES[:6])
    row = judged(tmp_path)["basic/gpt2/3"]
    assert row.status == FAILED and row.verdict.ok and row.missing_steps == (7, 8, 9, 10)
    assert "the log stops at step 6: steps 7-10 missing" in row.line()


def test_a_reference_cut_short_compares_the_common_steps_and_says_so(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE, losses=LOSSES[:8])
    write_log(run, "3", DP8)
    row = judged(tmp_path)["basic/gpt2/3"]
    assert row.status == PASSED and row.verdict.steps == tuple(range(1, 9))
    assert "the reference's log lacks steps 9-10: not compared" in row.line()


def test_a_bfloat16_twin_has_its_own_threshold(tmp_path):
    run = night(tmp_path)
    write_log(run, "2_bfloat16", ONE, dtype="bfloat16")
    write_log(run, "3_bfloat16", DP8, dtype="bfloat16", losses=off_from(2, 5e-3))
    write_log(run, "5_bfloat16", TP4_SP, dtype="bfloat16", losses=off_from(2, 2e-2))
    write_log(run, "2", ONE)  # the fp32 run is other mathematics
    rows = judged(tmp_path)
    assert rows["basic/gpt2/3_bfloat16"].reference.label == "basic/gpt2/2_bfloat16"
    assert rows["basic/gpt2/3_bfloat16"].status == PASSED  # 5e-3 < absolute 1e-2
    assert rows["basic/gpt2/5_bfloat16"].status == FAILED
    assert rows["basic/gpt2/5_bfloat16"].verdict.threshold == "absolute 0.01"


def test_a_flag_the_table_does_not_know_is_judged_with_its_role_assumed(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8 + " --allreduce_chunk_size_mb 128")
    row = judged(tmp_path)["basic/gpt2/3"]
    assert row.status == NO_REFERENCE  # kept in its reference: no run has it
    assert "--allreduce_chunk_size_mb (not in the flag table) is what sets it apart" in row.why
    assert "basic/gpt2/2 (one device) would be its reference" in row.why
    from harness.contracts.flags import DeclaredRoles
    declared = DeclaredRoles.parse(["allreduce_chunk_size_mb=topology"], "--flag-role")
    row = judged(tmp_path, declared=declared)["basic/gpt2/3"]
    assert row.status == PASSED and row.reference.label == "basic/gpt2/2"
    assert "--allreduce_chunk_size_mb=128" in row.topology_difference
    assert "role 'topology' (declared)" in row.line()


def test_bad_inputs_are_one_line_each_and_nothing_else_is_lost(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8)
    write_log(run, "5", TP4_SP + " --batch_size")  # a flag with no value at the end
    write_log(run, "1", BASE, program="gemma")  # a program without facts
    by = judged(tmp_path)
    assert by["basic/gpt2/3"].status == PASSED  # nothing else lost
    assert by["basic/gpt2/5"].status == BAD
    assert "gpt2_5.log: --batch_size is the last word; expected its value" in by["basic/gpt2/5"].why
    assert by["basic/gemma/1"].status == NOT_JUDGED
    assert "./gemma is a program the harness has no facts for" in by["basic/gemma/1"].why


def test_two_logs_of_one_case_in_one_run_folder_are_both_bad_inputs(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8)
    again = run / "logs" / "retry" / "basic"  # beside the run_metadata.log: tag basic again
    again.mkdir(parents=True)
    (again / "gpt2_3.log").write_text((run / "logs" / "basic" / "gpt2_3.log").read_text())
    rows = judge_reading(read_paths([tmp_path]))
    twice = [r for r in rows if r.label == "basic/gpt2/3"]
    assert [r.status for r in twice] == [BAD, BAD]
    assert "two logs of basic/gpt2/3 in one run folder" in twice[0].why
    assert str(again / "gpt2_3.log") in twice[0].why and "expected one" in twice[0].why
    assert {r.label: r.status for r in rows}["basic/gpt2/2"] == NO_REFERENCE


def test_a_log_without_a_command_line_is_judged_by_name_through_the_config(tmp_path):
    run = night(tmp_path, "202510_h800", "20251021", "master_2642ef8")
    write_log(run, "2", None, tag=None, metadata=False)
    write_log(run, "3", None, tag=None, metadata=False, losses=off_from(2, 1e-3))
    rows = judged(tmp_path)
    assert {r.status for r in rows.values()} == {NOT_JUDGED}
    assert "no [COMMAND] line, so its flags are unknown" in rows["gpt2/3"].why
    config = tmp_path / "test_config.json"
    config.write_text(json.dumps({
        "variables": {"BUILD_DIR": "build"},
        "test_groups": [{"tag": "basic", "tests": [
            {"id": "2", "args": {"batch_size": 80, "total_batch_size": 5120}},
            {"id": "3", "args": {"nthread_per_process": 8, "batch_size": 10,
                                 "total_batch_size": 5120}}]}]}))
    from harness.logs.cli import config_cases
    rows = judged(tmp_path, config_args=config_cases(str(config)))
    assert rows["gpt2/3"].status == FAILED and rows["gpt2/3"].reference.label == "gpt2/2"
    assert "(no [COMMAND] line: by name)" in rows["gpt2/3"].case.flags_from
    assert "no [COMMAND] line: judged by its name, with the flags of" in rows["gpt2/3"].line()


def test_a_stdout_step_line_and_a_context_parallel_field_are_read(tmp_path):
    run = night(tmp_path)
    write_log(run, "1", "--micro_batch_size 4 --global_batch_size 8", program="tiny_mixtral",
              tag="moe", stdout=True)
    write_log(run, "2", "--micro_batch_size 8 --global_batch_size 8", program="tiny_mixtral",
              tag="moe", stdout=True, losses=off_from(1, 1e-6))
    write_log(run, "2", ONE)
    write_log(run, "9", DP8.replace("--nthread_per_process 8", "--nthread_per_process 8 "
                                    "--context_parallel 2").replace("batch_size 10",
                                                                     "batch_size 20"),
              placement="DP=4, TP=1, SP=0, CP=2, PP=1")
    rows = judged(tmp_path)
    # microbatches of 4 or 8 sequences: the same 8-sequence step on one device
    assert rows["moe/tiny_mixtral/1"].status == REFERENCE
    assert rows["moe/tiny_mixtral/2"].status == PASSED
    assert rows["moe/tiny_mixtral/2"].reference.label == "moe/tiny_mixtral/1"
    assert rows["basic/gpt2/9"].status == PASSED
    assert rows["basic/gpt2/9"].topology_difference == "DP 4 × CP 2 against one device"
    assert rows["basic/gpt2/9"].case.run.meta["step_topology"]["CP"] == 2


def test_a_per_group_launch_runs_on_its_processes(tmp_path):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    log = run / "logs" / "basic" / "gpt2_3.log"
    write_log(run, "3", DP8.replace("--nthread_per_process 8", ""))
    log.write_text(log.read_text().replace("[COMMAND] ./gpt2", "[COMMAND] ./infini_run "
                                                               "--nproc_per_node=8 ./gpt2"))
    row = judged(tmp_path)["basic/gpt2/3"]
    assert row.status == PASSED and row.topology_difference == "DP 8 against one device"


# ------------------------------------------------------------------------ the archive


def _archive(tmp_path, nights):
    """nights: (machine, day, build, the TP + SP case's offset from step 2)."""
    for machine, day, build, off in nights:
        run = night(tmp_path, machine, day, build)
        write_log(run, "2", ONE, day=day)
        write_log(run, "3", DP8, day=day)
        write_log(run, "5", TP4_SP, losses=off_from(2, off), day=day)


def test_a_fixed_night_is_named_with_both_commits(tmp_path, capsys):
    _archive(tmp_path, [("g3025", "20260701", "master_aaaaaaa", 7e-4),
                        ("g3025", "20260702", "master_bbbbbbb", 7e-4),
                        ("g3025", "20260703", "master_ccccccc", 1e-6),
                        ("g3025", "20260704", "master_ddddddd", 1e-6)])
    out = tmp_path / "out"
    out.mkdir()
    code = main([str(tmp_path / "infinitrain"), "-o", str(out)])
    assert code == 1  # a night failed
    text = (out / "report.md").read_text()
    assert ("g3025: passes from `master@ccccccc` on 2026-07-03; failed on every earlier night "
            "since 2026-07-01 (last at `master@bbbbbbb` on 2026-07-02)") in text
    assert "failed: first 2026-07-01 (master@aaaaaaa), last 2026-07-02 (master@bbbbbbb)" in text
    assert "| basic/gpt2/5 | ✗ 16 | ✗ 16 | 0.022 | 0.022 |" in text
    records = [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]
    assert len(records) == 12
    five = [r for r in records if r["case"] == "basic/gpt2/5"]
    assert [r["status"] for r in five] == [FAILED, FAILED, PASSED, PASSED]
    first = five[0]
    assert (first["machine"], first["date"], first["branch"], first["commit"]) == (
        "g3025", "2026-07-01", "master", "aaaaaaa")
    assert first["reference"] == {"case": "basic/gpt2/2", "one_device": True,
                                  "topology": "one device",
                                  "source": first["reference"]["source"]}
    assert first["first_diverging_step"] == 2 and first["threshold"] == "relative 1e-05"
    assert first["worst"]["ratio"] == pytest.approx(7e-4 / (1e-5 * LOSSES[-1]), rel=1e-2)
    assert first["topology_difference"] == "DP 2 × TP 4 + SP against one device"
    assert first["flags"]["tensor_parallel"] == 4


def test_the_same_commit_on_two_machines_is_a_cross_hardware_pair(tmp_path):
    _archive(tmp_path, [("g3025", "20260710", "master_8779b98", 7e-4),
                        ("maca_c550_49", "20260710", "master_8779b98", 1e-6)])
    out = tmp_path / "report.md"
    main([str(tmp_path), "-o", str(out)])
    text = out.read_text()
    assert ("cross-hardware pair at 8779b98: g3025 failed (16x), maca_c550_49 passed "
            "(0.022x): the verdicts differ") in text
    assert "cross-hardware pair at 8779b98: g3025 passed" in text  # basic/gpt2/3 agrees


def test_every_run_gives_the_same_report_and_records(tmp_path):
    _archive(tmp_path, [("g3025", "20260701", "master_aaaaaaa", 7e-4)])
    out = tmp_path / "out"
    out.mkdir()
    texts = []
    for _ in range(2):
        assert main([str(tmp_path / "infinitrain"), "-o", str(out)]) == 1
        texts.append(((out / "report.md").read_text(), (out / "findings.jsonl").read_text()))
    assert texts[0] == texts[1]


def test_a_folder_with_no_readable_log_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "notes.txt").write_text("nothing here")
    assert main([str(tmp_path)]) == 2
    assert f"{tmp_path}: no recorded run" in capsys.readouterr().err
    assert main([str(tmp_path), str(tmp_path), str(tmp_path)]) == 2


def test_a_log_with_no_step_line_is_a_bad_input_and_the_rest_is_judged(tmp_path, capsys):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8)
    (run / "logs" / "basic" / "gpt2_5.log").write_text("[COMMAND] ./gpt2\nSegmentation fault\n")
    code = main([str(tmp_path), "-o", str(tmp_path / "r.md")])
    out = capsys.readouterr().out
    assert code == 1
    assert "PASSED basic/gpt2/3" in out
    assert "BAD INPUT basic/gpt2/5 float32: " in out and "no `step N/M | train loss X` lines" in out


def test_a_harness_session_folder_reports_its_own_live_verdicts(tmp_path, capsys):
    from harness.results import new_record
    session = tmp_path / "sessions" / "20260710-061811-1"
    session.mkdir(parents=True)
    records = [new_record(name=f"basic/gpt2/{case}", model="gpt2", case_id=case, tag="basic",
                          losses=[5.36, 5.06], steps=[1, 2], flags={"dtype": "float32"},
                          status=status)
               for case, status in (("3", "passed"), ("5", "failed"), ("6", "skipped"))]
    (session / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([str(tmp_path), "-o", str(tmp_path / "r.md")]) == 1
    out = capsys.readouterr().out
    assert "PASSED basic/gpt2/3 float32" in out and "FAILED basic/gpt2/5 float32" in out
    assert "the session's own verdict, against the one-device reference it ran" in out
    assert "NOT JUDGED basic/gpt2/6 float32" in out and "status 'skipped'" in out


def test_a_run_folder_with_no_readable_log_is_one_line(tmp_path, capsys):
    run = night(tmp_path)
    write_log(run, "2", ONE)
    write_log(run, "3", DP8)
    empty = night(tmp_path, day="20260711") / "logs"
    empty.mkdir(parents=True)
    (empty / "build_1.log").write_text("[ 10%] Building CXX object\n")  # a build log: no run
    assert main([str(tmp_path), "-o", str(tmp_path / "r.md")]) == 1
    out = capsys.readouterr().out
    assert "PASSED basic/gpt2/3" in out
    assert f"BAD INPUT ? ?: {empty}: no log the harness can read; expected" in out


def test_a_branch_with_a_slash_and_no_metadata_is_read_from_its_folders(tmp_path):
    # InfiniTrain-Test's g3025/20260703/fix/reducer_grad_accu/logs/basic/ (no run_metadata.log)
    run = tmp_path / "infinitrain" / "logs" / "g3025" / "20260703" / "fix" / "reducer_grad_accu"
    write_log(run, "2", ONE, metadata=False, day="20260702")
    write_log(run, "3", DP8, metadata=False, day="20260702")
    row = judged(tmp_path)["basic/gpt2/3"]
    assert row.status == PASSED
    place = row.place
    assert (place.machine, place.night, place.branch, place.commit) == (
        "g3025", "2026-07-03", "fix/reducer_grad_accu", None)
    assert place.label == "g3025/20260703/fix/reducer_grad_accu"


# A bfloat16 run that computes its loss in bfloat16 prints bfloat16 values (InfiniTrain-Test's
# 202510_h800 gpt2_2_bfloat16 of 2025-10-20: 4.937500, 4.906250, ...): one unit apart is 2**-5
# in [4, 8), more than bfloat16's threshold of 0.01.
BF16_LOSSES = (5.21875, 5.125, 5.03125, 4.9375, 4.875, 4.78125, 4.71875, 4.625, 4.5625, 4.5)


def test_a_bfloat16_loss_one_bfloat16_unit_apart_is_within_what_the_logs_can_print(tmp_path):
    run = night(tmp_path)
    write_log(run, "2_bfloat16", ONE, dtype="bfloat16", losses=BF16_LOSSES)
    write_log(run, "3_bfloat16", DP8, dtype="bfloat16", losses=off_from(7, 2 ** -5, BF16_LOSSES))
    write_log(run, "5_bfloat16", TP4_SP, dtype="bfloat16",
              losses=off_from(7, 3 * 2 ** -5, BF16_LOSSES))
    rows = judged(tmp_path)
    one = rows["basic/gpt2/3_bfloat16"]
    assert one.status == PASSED and one.verdict.resolution == 2 ** -5  # 0.031 > 0.01, one unit
    three = rows["basic/gpt2/5_bfloat16"]
    assert three.status == FAILED and three.verdict.first_diverging_step == 7
    assert "steps 1-6 agree and step 7 does not" in three.line()
    # a float32 loss (the autocast runs print 5.219541) keeps the printed 1e-6
    write_log(run, "6_bfloat16", DP8.replace("--nthread_per_process 8",
                                             "--nthread_per_process 8 --pipeline_parallel 8"),
              dtype="bfloat16", losses=off_from(7, 2 ** -5, LOSSES))
    write_log(run, "2_bfloat16", ONE, dtype="bfloat16", losses=LOSSES)
    rows = judged(tmp_path)
    assert rows["basic/gpt2/6_bfloat16"].verdict.resolution == 1e-6
    assert rows["basic/gpt2/6_bfloat16"].status == FAILED


def test_bfloat16_loss_resolution():
    from harness.compare.baseline import bfloat16_loss_resolution
    assert bfloat16_loss_resolution(BF16_LOSSES, (3.90625,)) == 2 ** -5
    assert bfloat16_loss_resolution((3.90625, 2.5)) == 2 ** -6
    assert bfloat16_loss_resolution(BF16_LOSSES, (5.219541,)) is None
    assert bfloat16_loss_resolution(()) is None and bfloat16_loss_resolution((0.0,)) is None
    # in [1, 2) a unit is 2**-7 and needs seven decimals: 1.0078125 prints 1.007812 (half a
    # unit of the sixth decimal off), still a bfloat16 value as printed
    assert bfloat16_loss_resolution((float(f"{1.0078125:.6f}"), 1.5)) == 2 ** -7
    assert bfloat16_loss_resolution((1.007814,)) is None  # 1.5e-6 off: a float32 loss


def test_the_flags_a_topology_shows_are_the_flag_tables_topology_flags():
    from harness.contracts.flags import FLAG_TABLE
    from harness.logs.selfcheck import TOPOLOGY_FIELDS
    assert {FLAG_TABLE[n].role for n in TOPOLOGY_FIELDS} == {"topology"}


def test_two_branches_of_one_night_on_one_machine_are_two_columns(tmp_path):
    # InfiniTrain-Test's 202510_h800/20251021 holds master_2642ef8 and optim_binary_backward_807fe46
    _archive(tmp_path, [("h800", "20251021", "master_2642ef8", 7e-4),
                        ("h800", "20251021", "optim_binary_backward_807fe46", 1e-6)])
    out = tmp_path / "report.md"
    main([str(tmp_path), "-o", str(out)])
    text = out.read_text()
    assert ("| case | 2025-10-21<br>h800<br>master@2642ef8 | 2025-10-21<br>h800<br>"
            "optim_binary_backward@807fe46 |") in text
    assert "| basic/gpt2/5 | ✗ 16 | 0.022 |" in text
