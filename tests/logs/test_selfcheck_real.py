"""The recorded self-check on real nights of InfiniTrain's nightly GPU runs: GPT-2 fp32 with
sequence parallel (basic cases 5 and 8) equals the one-device run (case 2) at step 1 and leaves
it from step 2, on an NVIDIA and on a MetaX machine; every other layout passes. The fixture is
a copy of those logs (fixtures/README.md); the whole shared copy is judged too where it is."""

from pathlib import Path

import pytest

from harness.logs.archive import judge_reading
from harness.logs.cli import main
from harness.logs.readers import read_paths
from harness.logs.selfcheck import FAILED, PASSED, REFERENCE

NIGHTS = Path(__file__).parent / "fixtures" / "nights"
SHARED = Path("/work/shared/data/infinitrain-test")
G3025 = "g3025/20260710/master_8779b98"
MACA = "maca_c550_49/20260731/perf_muxi_device_registry_0347fa4"
# (run folder, case): (status, first diverging step, worst |diff| as the logs print it)
EXPECTED = {
    (G3025, "basic/gpt2/2"): (REFERENCE, None, None),
    (G3025, "basic/gpt2/3"): (PASSED, None, 1.7e-5),
    (G3025, "basic/gpt2/5"): (FAILED, 2, 4.4e-3),
    (G3025, "basic/gpt2/6"): (PASSED, None, 1.6e-5),
    (G3025, "basic/gpt2/7"): (PASSED, None, 1.6e-5),
    (G3025, "basic/gpt2/8"): (FAILED, 2, 2.7e-3),
    (MACA, "basic/gpt2/2"): (REFERENCE, None, None),
    (MACA, "basic/gpt2/4"): (PASSED, None, 1.4e-5),
    (MACA, "basic/gpt2/5"): (FAILED, 2, 4.4e-3),
    (MACA, "basic/gpt2/6"): (PASSED, None, 1.4e-5),
    (MACA, "basic/gpt2/8"): (FAILED, 2, 2.7e-3),
}


def _rows(root, **kw):
    return {(r.place.label, r.label): r for r in judge_reading(read_paths([root]), **kw)}


def _gpt2_fp32(rows):
    return {key: (r.status, r.verdict.first_diverging_step if r.verdict else None,
                  round(r.verdict.max_abs_diff, 7) if r.verdict else None)
            for key, r in rows.items() if "/gpt2/" in key[1] and r.dtype == "float32"
            and r.status in (PASSED, FAILED, REFERENCE)}


def _check(rows):
    got = _gpt2_fp32(rows)
    want = {k: (s, f, pytest.approx(w, rel=0.05) if w else None)
            for k, (s, f, w) in EXPECTED.items()}
    assert {k: got[k] for k in want} == want
    for key in [(G3025, "basic/gpt2/5"), (MACA, "basic/gpt2/8")]:
        row = rows[key]
        assert row.reference.label == "basic/gpt2/2" and row.one_device
        assert row.verdict.diffs[0] <= 4e-6  # step 1 equal to the printed 6 decimals
        assert "the update after step 1 differs" in row.line()
    assert rows[(G3025, "basic/gpt2/5")].topology_difference == \
        "DP 2 × TP 4 + SP against one device"


def test_the_fixture_nights_fail_sequence_parallel_from_step_2_and_pass_the_rest():
    _check(_rows(NIGHTS))


def test_the_two_machines_agree_on_every_case(tmp_path):
    # not the same commit, so no cross-hardware pair: the same verdicts on both machines
    code = main([str(NIGHTS), "-o", str(tmp_path)])
    assert code == 1
    text = (tmp_path / "report.md").read_text()
    assert "| basic/gpt2/5 | ✗ 95 | ✗ 95 |" in text and "| basic/gpt2/8 | ✗ 58 | ✗ 58 |" in text
    assert "failed on g3025, maca_c550_49, at master@8779b98, perf/muxi_device_registry@0347fa4" \
        in text


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared copy at {SHARED}")
def test_the_whole_shared_copy(tmp_path):
    from harness.contracts.flags import DeclaredRoles
    # MetaX's DP cases carry --allreduce_chunk_size_mb, a flag the table does not know
    declared = DeclaredRoles.parse(["allreduce_chunk_size_mb=topology"], "--flag-role")
    rows = _rows(SHARED, declared=declared)
    _check(rows)
    assert rows[(MACA, "basic/gpt2/3")].status == PASSED
    assert rows[("202511_a800/20251127/e7d57db_master", "gpt2/3")].status == PASSED


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared copy at {SHARED}")
def test_the_whole_shared_copy_from_the_command_line(tmp_path, capsys):
    code = main([str(SHARED), "--flag-role", "allreduce_chunk_size_mb=topology",
                 "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "BAD INPUT" not in out  # the baselines' logs/ folders are no runs
    assert out.count("\nFAILED ") + out.startswith("FAILED ") == 9
    assert "note: " in out and "a pytorch log, not a run folder's" in out


INFINI_RUN = Path(__file__).parent / "fixtures" / "infini_run"


def test_a_real_per_group_launch_through_infini_run_is_judged_on_its_processes(tmp_path):
    # the newer runner's 8_proc group: ./infini_run --nproc_per_node=8 ./gpt2
    # --nthread_per_process 1 --tensor_parallel 4 --sequence_parallel true (fixtures/README.md)
    rows = {r.label: r for r in judge_reading(read_paths([INFINI_RUN]))}
    row = rows["8_proc/gpt2/5_8proc"]
    assert row.case.topology.world == 8 and row.case.args["nthread_per_process"] == 1
    assert row.topology_difference == "DP 2 × TP 4 + SP against one device"
    assert row.reference.label == "basic/gpt2/2"  # the folder's one-device run, another tag
    assert row.status == FAILED and row.verdict.first_diverging_step == 2
    assert row.place.branch == "fix/dataloader-global-batches"  # the log's own [GIT_BRANCH]
    assert row.place.commit.startswith("2c2fc03")
    out = tmp_path / "new" / "folder"  # -o a folder that is not there yet: made
    assert main([str(INFINI_RUN), "-o", str(out)]) == 1
    assert (out / "report.md").is_file() and (out / "findings.jsonl").is_file()
