"""pytester tests of the plugin: markers, ids, --gpus skips, bad configs, the fake backend's
failure paths, results records, and under -n 2 lease exclusivity and reference-once."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import fake_config, harness_args

OK = [{"id": "ok", "args": {}}, {"id": "pp2-partition-3-5",
                                "args": {"pipeline_parallel": 2, "pipeline_layer_partition": "3,5"}}]


def test_markers_ids_and_strict_markers(pytester, harness_dir):
    harness_dir(fake_config(OK, tag="layouts", models=("gpt2", "llama3")))
    result = pytester.runpytest(*harness_args(pytester, "--strict-markers", "--co", "-q",
                                              "-m", "layouts"))
    result.stdout.fnmatch_lines([
        "cases.json::layouts/gpt2/ok",
        "cases.json::layouts/llama3/ok",
        "cases.json::layouts/gpt2/pp2-partition-3-5",
        "cases.json::layouts/llama3/pp2-partition-3-5",
    ])
    assert result.ret == 0
    result = pytester.runpytest(*harness_args(pytester, "--strict-markers", "--co", "-q",
                                              "-k", "llama3 and pp2"))
    result.stdout.fnmatch_lines(["cases.json::layouts/llama3/pp2-partition-3-5", "*1/4 tests*"])
    result = pytester.runpytest(*harness_args(pytester, "--markers"))
    result.stdout.fnmatch_lines(["@pytest.mark.layouts: test config tag 'layouts'*"])
    assert not (pytester.path / "out").exists()  # collecting only: no session folder, no header


def test_cases_pass_and_results_are_recorded(pytester, harness_dir):
    harness_dir(fake_config(OK + [{"id": "deselected", "args": {}}]))
    pytester.makeconftest("""
        import shutil
        def pytest_runtest_setup(item):  # the header as it is while cases run
            for path in item.config.rootpath.glob("out/sessions/*/session.json"):
                shutil.copy(path, item.config.rootpath / "during.json")
    """)
    result = pytester.runpytest(*harness_args(pytester, "--junitxml", "junit.xml", "--gpus", "2",
                                              "-k", "not deselected"))
    result.assert_outcomes(passed=2)
    results = list((pytester.path / "out" / "sessions").glob("*/results.jsonl"))
    assert len(results) == 1
    header = json.loads((results[0].parent / "session.json").read_text())
    assert header["format"] == "harness.session/1" and header["session"] == results[0].parent.name
    assert header["collected"] == ["fake/gpt2/ok", "fake/gpt2/pp2-partition-3-5"]
    assert header["config_path"] == str(pytester.path / "cases.json")
    assert header["args"][header["args"].index("-k") + 1] == "not deselected"
    assert header["started_at"] <= header["finished_at"]
    during = json.loads((pytester.path / "during.json").read_text())
    assert during["finished_at"] is None and during["collected"] == header["collected"]
    records = [json.loads(line) for line in results[0].read_text().splitlines()]
    assert [r["name"] for r in records] == ["fake/gpt2/ok", "fake/gpt2/pp2-partition-3-5"]
    record = records[1]
    assert record["status"] == "passed" and record["world_size"] == 2
    assert record["loss"]["mismatched"] == 0 and record["gradients"]["parameters"] == 19
    assert record["tokens_per_s"] == 2000 and record["peak_memory_mb"] == 12
    assert record["layout"]["chunks"] == [[0, 0, 3], [1, 3, 8]]
    assert record["reference"]["built"] is False  # the first case built it
    assert record["command"][0].endswith("python") or "python" in record["command"][0]
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="harness_status" value="passed"' in junit
    assert 'name="tokens_per_s"' in junit


def test_gpus_skips_cases_needing_more(pytester, harness_dir):
    harness_dir(fake_config([{"id": "dp4", "args": {"data_parallel": 4}},
                             {"id": "tp2-pp2", "args": {"tensor_parallel": 2, "pipeline_parallel": 2}},
                             {"id": "ok", "args": {}}]))
    result = pytester.runpytest(*harness_args(pytester, "--gpus", "2", "-rs"))
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*needs 4 devices (dp 4 x tp 1 x pp 1), but --gpus allows 2*",
        "*needs 4 devices (dp 1 x tp 2 x pp 2), but --gpus allows 2*",
    ])


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["test_groups"][0]["tests"][0]["args"].update(batch_sise=4),
     "*cases.json: tag 'fake', case 'ok', field args.batch_sise: unknown trainer flag 'batch_sise'*"),
    (lambda d: d.update(toleranses={}),
     "*cases.json: top level: unknown key 'toleranses'; expected one of:*"),
])
def test_bad_config_fails_collection_with_one_line(pytester, harness_dir, mutate, expected):
    data = fake_config([{"id": "ok", "args": {}}])
    mutate(data)
    harness_dir(data)
    result = pytester.runpytest(*harness_args(pytester))
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error
    result.stdout.fnmatch_lines([expected])
    assert "Traceback" not in result.stdout.str()


FAILURES = [{"id": i, "args": {"pipeline_parallel": 2}} for i in
            ("crash", "hang", "nan", "missing-grad", "extra-grad", "bad-loss", "bad-grad")]


def test_failure_paths_against_the_fake_backend(pytester, harness_dir):
    harness_dir(fake_config(FAILURES + [{"id": "ok", "args": {}}]))
    result = pytester.runpytest(*harness_args(pytester, "--harness-timeout", "2", "--gpus", "2"))
    result.assert_outcomes(passed=1, failed=7)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*fake/gpt2/crash: the run failed: rank 1 of 2 failed first; exit code 3*",
        "command: *fake_trainer.py --case fake/gpt2/crash*",
        "*--- rank 1: *rank1.log (last lines) ---*",
        "RuntimeError: planted crash on the last rank",
    ])
    result.stdout.fnmatch_lines([
        "*fake/gpt2/hang: the run failed: timed out after 2 s (--harness-timeout); every process*"])
    child = int((pytester.path / "out").glob("sessions/*/cases/fake/gpt2/hang/child.pid")
                .__next__().read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the hung run's grandchild went with its process group
    result.stdout.fnmatch_lines([
        "*fake/gpt2/nan: the run differs from the single-device reference*",
        "*loss is not finite (NaN / inf) at step(s) 2*",
        "*loss: mismatched 1 of 3 steps (atol=1e-05 rtol=0); first diverging step 2: got nan*",
        "*gradients: mismatched 1 of 19 parameters (1 of 228 elements; atol=1e-05 rtol=0); "
        "1 elements are NaN / inf in the run*",
    ])
    result.stdout.fnmatch_lines(["*gradients: 1 missing from the run: h.1.mlp.c_fc.weight*"])
    result.stdout.fnmatch_lines(["*gradients: 1 not in the reference: h.9.bogus.weight*"])
    result.stdout.fnmatch_lines([
        "*fake/gpt2/bad-loss: the run differs*",
        "*loss: mismatched 1 of 3 steps (atol=1e-05 rtol=0); first diverging step 3: got 4.635,"
        " reference 4.625, |diff| 0.01*"])
    result.stdout.fnmatch_lines([
        "*fake/gpt2/bad-grad: the run differs*",
        "*gradients: mismatched 1 of 19 parameters (12 of 228 elements*",
        "*worst parameters:*",
        "*parameter*stage*layer*mismatched*",
        "*h.5.attn.c_proj.weight*1*5*12/12*",
    ])
    # Only the planted one, in the crash's log tail. The short summary is cut off first: with
    # CI set, pytest repeats each failure's whole message there.
    failures = out.split("short test summary info")[0]
    assert failures.count("Traceback") == 1
    records = [json.loads(line) for line in
               next((pytester.path / "out").glob("sessions/*/results.jsonl")).read_text().splitlines()]
    by_id = {r["case_id"]: r for r in records}
    assert by_id["crash"]["failing_rank"] == "1" and by_id["crash"]["returncode"] == 3
    assert by_id["hang"]["timed_out"] is True
    assert by_id["bad-grad"]["gradients"]["worst"][0]["stage"] == "1"
    assert by_id["ok"]["status"] == "passed"


def test_xdist_leases_are_exclusive_and_reference_runs_once(pytester, harness_dir):
    tests = [{"id": f"slow-{i}", "args": {"data_parallel": 2}} for i in range(2)]
    tests += [{"id": "slow-single-0", "args": {}}]
    config = fake_config(tests, models=("gpt2", "llama3"))
    config["defaults"]["total_batch_size"] = 16  # one reference key for dp 1 and dp 2
    harness_dir(config)
    records = pytester.path / "records"
    os.environ["FAKE_RECORD_DIR"] = str(records)
    try:
        result = pytester.runpytest_subprocess(*harness_args(pytester, "-n", "2", "--gpus", "3"))
        result.assert_outcomes(passed=6)
        leases = [json.loads(line) for line in (records / "leases.jsonl").read_text().splitlines()]
        assert len(leases) == 6
        for a in leases:
            for b in leases:
                if a is b or not set(a["slots"].split(",")) & set(b["slots"].split(",")):
                    continue
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
        (header,) = (pytester.path / "out").glob("sessions/*/session.json")  # the controller's
        collected = json.loads(header.read_text())["collected"]
        assert sorted(collected) == sorted(f"fake/{m}/{t['id']}" for m in ("gpt2", "llama3")
                                           for t in tests)
        references = (records / "references.jsonl").read_text().splitlines()
        assert sorted(json.loads(r)["model"] for r in references) == ["gpt2", "llama3"]
        # A second session reuses the cached references (same inputs): no new reference run.
        result = pytester.runpytest(*harness_args(pytester, "--gpus", "3", "-k", "single-0"))
        result.assert_outcomes(passed=2)
        assert len((records / "references.jsonl").read_text().splitlines()) == 2
    finally:
        del os.environ["FAKE_RECORD_DIR"]


def test_a_reference_build_says_so_on_the_terminal(pytester, harness_dir):
    """A first session's long silent part (reference builds) is announced, once per key."""
    harness_dir(fake_config(OK))
    result = pytester.runpytest(*harness_args(pytester, "--gpus", "2"))
    result.assert_outcomes(passed=len(OK))
    lines = [l for l in result.stdout.lines if l.startswith("[harness] building the reference")]
    assert len(lines) == 1, result.stdout.str()
    assert "(one device; once per key, then cached in " in lines[0]
    again = pytester.runpytest(*harness_args(pytester, "--gpus", "2"))  # cached: nothing said
    assert not [l for l in again.stdout.lines if l.startswith("[harness] building")]
