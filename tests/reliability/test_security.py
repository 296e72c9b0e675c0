"""Config values reach the trainer as argv items, never through a shell; @VAR@ substitution
evaluates nothing; case ids and tags cannot point outside the output folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cases import ConfigError, load_config
from tests.plugin.conftest import fake_config, harness_args

from .checks import jsonl, results, the_session


def canaries(folder: Path) -> dict[str, Path]:
    return {name: folder / f"pwned-{name}" for name in ("semicolon", "dollar", "backtick", "env")}


def test_hostile_values_arrive_verbatim_as_one_argv_item(pytester, harness_dir, records):
    c = canaries(pytester.path)
    hostile = {
        "semicolon": f"; touch {c['semicolon']}",
        "dollar": "@EVIL@",
        "backtick": "x@TICK@y",
    }
    config = fake_config([{"id": name, "args": {"pipeline_model_parallel_layout": value}}
                          for name, value in hostile.items()])
    config["variables"] = {"EVIL": f"$(touch {c['dollar']})", "TICK": f"`touch {c['backtick']}`"}
    config["trainer"]["env"] = {"HARNESS_HOSTILE": f"$(touch {c['env']})"}
    harness_dir(config)
    result = pytester.runpytest(*harness_args(pytester))
    result.assert_outcomes(passed=3)
    expected = {
        "semicolon": f"--pipeline_model_parallel_layout=; touch {c['semicolon']}",
        "dollar": f"--pipeline_model_parallel_layout=$(touch {c['dollar']})",
        "backtick": f"--pipeline_model_parallel_layout=x`touch {c['backtick']}`y",
    }
    argvs = {r["case"].rsplit("/", 1)[-1]: r["argv"] for r in jsonl(records / "pids.jsonl")}
    session = the_session(pytester.path / "out")
    by_name = results(session)
    for name, item in expected.items():
        assert item in argvs[name]  # one argv element, unchanged
        assert item in by_name[f"fake/gpt2/{name}"]["command"]
        out = Path(by_name[f"fake/gpt2/{name}"]["output_dir"]).resolve()
        assert out.is_relative_to((session / "cases").resolve())
    assert not [p for p in c.values() if p.exists()], "a value was run by a shell"


@pytest.mark.parametrize("case_id", ["../evil", "..", "/abs/path", "a/b", "ok\n", "-x", ""])
def test_ids_that_are_paths_are_refused_at_load(tmp_path, case_id):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"test_groups": [{"tag": "t", "tests": [{"id": case_id}]}]}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: tag 't', " in str(info.value)
    assert f"field id: {case_id!r} does not match the pattern" in str(info.value)


@pytest.mark.parametrize("tag", ["../t", "t/u", "/t", "t\n"])
def test_tags_that_are_paths_are_refused_at_load(tmp_path, tag):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"test_groups": [{"tag": tag, "tests": [{"id": "a"}]}]}))
    with pytest.raises(ConfigError, match="field tag: .* does not match the pattern"):
        load_config(path)


@pytest.mark.slow
def test_a_hostile_layout_value_is_refused_as_text_before_anything_runs(pytester, tiny_assets):
    """The plan stage parses the value as a layout (harness.layout, the trainer's own parser)
    and refuses it as a config error: nothing is launched, no shell ever sees it. (That a value
    reaches a trainer as one argv item: test_hostile_values_arrive_verbatim_as_one_argv_item.)"""
    canary = pytester.path / "pwned-real"
    value = f"$(touch {canary}); touch {canary}"
    config = {"models": ["gpt2"],
              "defaults": {"num_iteration": 1, "batch_size": 1, "sequence_length": 8},
              "test_groups": [{"tag": "sec", "tests": [
                  {"id": "hostile", "args": {"pipeline_model_parallel_layout": value}}]}]}
    (pytester.path / "cases.json").write_text(json.dumps(config))
    result = pytester.runpytest(*harness_args(pytester, "--gpus", "1"))
    result.assert_outcomes(failed=1)
    record = results(the_session(pytester.path / "out"))["sec/gpt2/hostile"]
    assert record["status"] == "error" and record["command"] is None
    assert f"--pipeline_model_parallel_layout {value!r}: unknown symbol '$' at position 0" \
        in record["errors"][0]
    assert not canary.exists()
