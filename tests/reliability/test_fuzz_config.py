"""Mutated test configs through load_config: each loads, or is refused with ConfigError as one
line naming the file and where in it (top level, tag, case, field); never another exception.
Case ids and tags that would reach the file system are checked to stay inside the output."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.cases import ConfigError, load_config

BASE = {
    "variables": {"ITERS": 3, "PART": "3,5", "NAME": "x"},
    "models": ["gpt2", "llama3"],
    "model_files": {"gpt2": {"checkpoint": "g.bin", "input_bin": "g_tokens.bin"}},
    "assets": {"preset": "tiny", "seed": 0},
    "defaults": {"num_iteration": "@ITERS@", "batch_size": 2, "sequence_length": 8},
    "tolerances": {"float32": {"loss": {"atol": 1e-5, "rtol": 0},
                               "gradients": {"atol": 1e-5, "rtol": 0}}},
    "compare": {"loss": True, "gradients": True},
    "test_groups": [
        {"tag": "basic", "defaults": {"total_batch_size": 32},
         "tests": [{"id": "pp2", "args": {"pipeline_parallel": 2,
                                          "pipeline_layer_partition": "@PART@"}},
                   {"id": "dp2", "args": {"data_parallel": 2}, "models": ["gpt2"],
                    "tolerances": {"loss": {"atol": 1e-4}}}]},
        {"tag": "more", "tests": [{"id": "tp2", "args": {"tensor_parallel": 2},
                                   "description": "d"}]},
    ],
}

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**65), st.floats(allow_nan=False),
              st.sampled_from(["", "@ITERS@", "@NOPE@", "../x", "/abs", "a b", "3,5", "0",
                               "true", "gpt2", "1e-5", "x" * 50, "tag\n", "@PART@@NAME@"]),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["id", "args", "tag", "atol", "x",
                                                             "batch_size", "loss"]), inner,
                                            max_size=3)),
    max_leaves=6)


def paths(value, prefix=()):
    """Every location in a JSON value."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, prefix + (index,))


ALL_PATHS = list(paths(BASE))[1:]


@st.composite
def mutated(draw):
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(ALL_PATHS))
        parent = data
        try:
            for part in where[:-1]:
                parent = parent[part]
            kind = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
            if kind == "replace":
                parent[where[-1]] = draw(JSON)
            elif kind == "delete":
                del parent[where[-1]]
            elif isinstance(parent[where[-1]], dict):
                parent[where[-1]][draw(st.sampled_from(["extra", "batch_size", "id", "atol"]))] = \
                    draw(JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed the path
    return data


def load_or_refuse(tmp_path: Path, data, text=None):
    path = tmp_path / "cases.json"
    path.write_text(text if text is not None else json.dumps(data))
    try:
        config = load_config(path)
    except ConfigError as error:
        message = str(error)
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        where = message[len(str(path)) + 2:]
        assert where.startswith(("top level", "tag ", "test_groups[", "field ", "invalid JSON",
                                 "cannot read")), message
        return None
    for case in config.cases:  # what reaches the file system stays inside the output folder
        out = (tmp_path / "session" / "cases" / case.tag / case.model / case.case_id).resolve()
        assert out.is_relative_to((tmp_path / "session" / "cases").resolve()), case.name
        assert len(Path(case.tag, case.model, case.case_id).parts) == 3, case.name
    return config


FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_the_unmutated_config_loads(tmp_path):
    assert len(load_or_refuse(tmp_path, BASE).cases) == 5


@FUZZ
@given(data=mutated())
def test_mutated_configs_load_or_fail_with_one_line_naming_the_field(tmp_path, data):
    load_or_refuse(tmp_path, data)


@FUZZ
@given(cut=st.integers(0, len(json.dumps(BASE))), junk=st.sampled_from(["", "}", "NaN", "\x00"]))
def test_damaged_json_text_is_refused_with_a_position(tmp_path, cut, junk):
    text = json.dumps(BASE)
    load_or_refuse(tmp_path, None, text[:cut] + junk)


IDS = st.one_of(st.sampled_from(["../evil", "..", ".", "/abs/path", "a/b", "a\\b", "ok\n", "ok\n/..",
                                 "-x", "a..b", "\u2028", "x" * 300]),
                st.text(max_size=10))


@FUZZ
@given(case_id=IDS, tag=st.one_of(st.just("basic"), st.sampled_from(["../t", "t/u", "t\n"]),
                                  st.text(max_size=6)),
       via_variable=st.booleans())
@example(case_id="ok\n", tag="basic", via_variable=False)
@example(case_id="ok", tag="basic\n", via_variable=False)
def test_case_ids_and_tags_cannot_leave_the_output_folder(tmp_path, case_id, tag, via_variable):
    data = copy.deepcopy(BASE)
    data["test_groups"][0]["tag"] = tag
    if via_variable:  # a variable cannot smuggle a path into an id either (ids take none)
        data["variables"]["NAME"] = case_id
        data["test_groups"][1]["tests"][0]["id"] = "@NAME@"
    else:
        data["test_groups"][0]["tests"][0]["id"] = case_id
    config = load_or_refuse(tmp_path, data)
    if config is not None:
        for case in config.cases:
            for part in (case.tag, case.case_id):
                assert "/" not in part and "\\" not in part and part not in (".", "..")
                assert part.isprintable(), part
