"""Any harness config named as a path is collected as cases (and only it when it is the only
path); `--harness-config X` alone does not add the ini's testpaths; the terminal summary ends
with the session folder, the counts per tag and model and the report command; the session is
recorded for `python -m harness.report` (the last-session pointer)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from harness.results.baseline_summary import baseline_summary

from .conftest import fake_config, plugin_args

OK = [{"id": "ok", "args": {}}, {"id": "pp2", "args": {"pipeline_parallel": 2}}]
COMMON = ["--harness-device", "cpu", "-p", "no:cacheprovider", "--gpus", "2"]


def _with_unit_suite(pytester) -> None:
    pytester.makeini("[pytest]\ntestpaths = unit cases.json\n")
    (pytester.path / "unit").mkdir()
    (pytester.path / "unit" / "test_unit.py").write_text("def test_unit():\n    pass\n")


def test_a_config_given_as_a_path_is_collected_alone(pytester, harness_dir):
    _with_unit_suite(pytester)
    harness_dir(fake_config(OK))
    mine = pytester.path / "my_config.json"
    shutil.copy(pytester.path / "cases.json", mine)
    out = pytester.path / "out"
    result = pytester.runpytest(*plugin_args(), "my_config.json", "--harness-output", str(out),
                                *COMMON, "-q", "--co")
    result.stdout.fnmatch_lines(["my_config.json::fake/gpt2/ok", "my_config.json::fake/gpt2/pp2",
                                 "2 tests collected*"])
    assert "test_unit" not in result.stdout.str()
    named = pytester.path / "sub" / "test_config.json"  # the default's name, not the default
    named.parent.mkdir()
    shutil.copy(mine, named)
    data = json.loads(named.read_text())
    data["test_groups"][0]["tag"] = "mine"
    named.write_text(json.dumps(data))
    result = pytester.runpytest(*plugin_args(), str(named), *COMMON, "-q", "--co")
    result.stdout.fnmatch_lines(["*test_config.json::mine/gpt2/ok", "2 tests collected*"])
    result = pytester.runpytest(*plugin_args(), "my_config.json", str(named), *COMMON)
    assert result.ret != 0 and "one harness config per session" in result.stderr.str()


def test_a_config_outside_the_rootdir_runs_and_the_summary_says_where(
        pytester, harness_dir, tmp_path_factory):
    harness_dir(fake_config(OK, models=("gpt2", "llama3")))
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    config = elsewhere / "my_config.json"
    data = json.loads((pytester.path / "cases.json").read_text())
    data["model_files"] = {m: {k: str(pytester.path / v) for k, v in files.items()}
                           for m, files in data["model_files"].items()}
    config.write_text(json.dumps(data))
    out = pytester.path / "out"
    result = pytester.runpytest(*plugin_args(), str(config), "--harness-output", str(out),
                                *COMMON, "-k", "not llama3 or ok")
    result.assert_outcomes(passed=3, deselected=1)
    [session] = (out / "sessions").iterdir()
    lines = [line for line in result.stdout.str().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if "harness session" in line)
    # The plugin's last summary section; pytest's own result line follows it.
    assert lines[start + 1:] == [
        f"session folder: {session.resolve()}",
        "trainer: command (fake-1), device cpu",  # the trainer under test, stated
        "  fake / gpt2: 2 passed", "  fake / llama3: 1 passed",
        # the session's cases joined the output folder's history (harness.history)
        f"history: 3 cases appended to {out / 'history' / 'history.jsonl'} "
        f"(python -m harness.history {out})",
        baseline_summary([{"trainer": "command"}]),  # a foreign trainer: none checked
        f"report: python -m harness.report {session.resolve()}",
        lines[-1]]
    assert "3 passed" in lines[-1]
    pointer = Path(os.environ["HARNESS_LAST_SESSION"])
    assert pointer.read_text().strip() == str(session.resolve())


def test_a_config_outside_the_rootdir_under_xdist_gets_its_session_header(
        pytester, harness_dir, tmp_path_factory):
    # The controller learns the cases from its workers' node ids; those of a config outside
    # the rootdir start with "::", and the session used to get no header at all (no trainer,
    # no config, no collected list for the report).
    harness_dir(fake_config(OK))
    config = tmp_path_factory.mktemp("elsewhere") / "test_config.json"
    data = json.loads((pytester.path / "cases.json").read_text())
    data["model_files"] = {m: {k: str(pytester.path / v) for k, v in files.items()}
                           for m, files in data["model_files"].items()}
    config.write_text(json.dumps(data))
    out = pytester.path / "out"
    ini = pytester.makeini("[pytest]\n")  # as docs/benchmarks.md runs InfiniTrain's config
    result = pytester.runpytest_subprocess(*plugin_args(), "-c", str(ini), "--rootdir",
                                           str(pytester.path), "--harness-config", str(config),
                                           "--harness-output", str(out), *COMMON, "-n", "2")
    result.assert_outcomes(passed=2)
    (header,) = out.glob("sessions/*/session.json")
    assert sorted(json.loads(header.read_text())["collected"]) == ["fake/gpt2/ok",
                                                                   "fake/gpt2/pp2"]
    # the session's settings, typed: the options as given and pytest's -n (xdist's workers)
    settings = json.loads(header.read_text())["settings"]
    assert (settings["config"], settings["output"], settings["workers"]) == (str(config),
                                                                             str(out), 2)
    assert settings["device"] == "cpu" and settings["marker"] is None
    assert "trainer: command (fake-1), device cpu" in result.stdout.str()


def test_harness_config_alone_does_not_add_the_testpaths(pytester, harness_dir):
    _with_unit_suite(pytester)
    harness_dir(fake_config(OK))
    mine = pytester.path / "mine.json"
    shutil.copy(pytester.path / "cases.json", mine)
    result = pytester.runpytest(*plugin_args(), "--harness-config", "mine.json", *COMMON,
                                "-q", "--co")
    result.stdout.fnmatch_lines(["mine.json::fake/gpt2/ok", "mine.json::fake/gpt2/pp2",
                                 "2 tests collected*"])
    assert "test_unit" not in result.stdout.str()
    # No path and no --harness-config: the ini's testpaths, as CI runs it.
    result = pytester.runpytest(*plugin_args(), "--harness-config", "cases.json", "unit",
                                *COMMON, "-q", "--co")
    result.stdout.fnmatch_lines(["unit/test_unit.py::test_unit", "cases.json::fake/gpt2/ok",
                                 "*3 tests collected*"])
    result = pytester.runpytest(*plugin_args(), *COMMON, "-q", "--co")
    result.stdout.fnmatch_lines(["unit/test_unit.py::test_unit", "cases.json::fake/gpt2/ok",
                                 "*3 tests collected*"])


def test_a_relative_output_folder_is_taken_from_where_pytest_runs(pytester, harness_dir):
    """Trainers run in folders of their own: a relative --harness-output must not reach them
    as a relative path (a reference would dump into a folder the harness never reads)."""
    harness_dir(fake_config(OK))
    result = pytester.runpytest(*plugin_args(), "cases.json", "--harness-output", "rel-out",
                                *COMMON)
    result.assert_outcomes(passed=2)
    [results] = (pytester.path / "rel-out").glob("sessions/*/results.jsonl")
    for record in map(json.loads, results.read_text().splitlines()):
        assert Path(record["output_dir"]).is_absolute()
        assert Path(record["reference"]["path"]).is_absolute()
        assert Path(record["reference"]["path"]).is_relative_to(pytester.path / "rel-out")
