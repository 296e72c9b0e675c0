"""The harness's options are one table (harness.runner.settings.Options): pytest is given them
from it, reads them back through it, and Settings are derived from it in one place, so no
option can be declared, defaulted or read by one part and forgotten by another."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from harness.cases.config_types import BACKENDS, Overrides
from harness.cases.schema import SCHEMA
from harness.runner.settings import (
    LAUNCHERS,
    Options,
    Settings,
    declarations,
    flag_of,
    named_configs,
    option_fields,
    paths_read_as_test_paths,
    rootdir_problem,
)


def _harness_group_options(pytestconfig) -> dict[str, object]:
    """flag -> pytest's declared option, for every option in this session's harness group."""
    group = pytestconfig._parser.getgroup("harness")
    return {name: option for option in group.options for name in option.names()}


def test_every_harness_option_pytest_knows_comes_from_the_table(pytestconfig):
    declared = _harness_group_options(pytestconfig)
    table = {flag for flag, _ in declarations() + declarations(late=True)}
    assert set(declared) == table and len(table) == 25  # 24 at addoption, 1 late


def test_each_option_default_is_the_dataclass_default(pytestconfig):
    declared = _harness_group_options(pytestconfig)
    for f in fields(Options):
        if "option" not in f.metadata:
            continue
        option = declared[f.metadata["option"].flag]
        default = option.default
        if isinstance(default, list):  # an append option's fresh list
            default = tuple(default)
        assert default == f.default, f.metadata["option"].flag


def test_settings_defaults_are_the_options_defaults():
    table = option_fields()
    for f in fields(Settings):
        if f.name in table:
            assert f.default == Options.__dataclass_fields__[f.name].default, f.name


def test_choices_come_from_the_one_tuple_each():
    table = option_fields()
    assert table["trainer"].choices == BACKENDS
    assert table["launcher"].choices == ("auto", *LAUNCHERS)
    assert SCHEMA["properties"]["trainer"]["properties"]["backend"]["enum"] == \
        list(BACKENDS)


def test_the_options_read_back_typed_from_one_getoption_loop():
    given = {"--gpus": 2, "--harness-var": ["A=1"], "--harness-launcher": "zygote",
             "markexpr": "", "keyword": "pp2"}  # pytest's -m / -k are "" when not given
    defaults = {o.flag: f.default for f in fields(Options) if (o := f.metadata.get("option"))}
    asked = []

    def getoption(name, *default):  # pytest's config.getoption; -n is absent without xdist
        asked.append(name)
        return given.get(name, *default) if default else given.get(name, defaults[name])

    options = Options.from_pytest(getoption)
    assert (options.slots, options.variables, options.launcher) == (2, ("A=1",), "zygote")
    assert (options.marker, options.keyword, options.workers) == (None, "pp2", None)
    assert set(asked) == set(defaults) | {"numprocesses", "markexpr", "keyword"}


def test_an_option_outside_its_choices_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--harness-launcher 'fork': expected one of "
                                         r"auto, torchrun, zygote"):
        Options(launcher="fork")
    with pytest.raises(ValueError, match=r"--gpus 'two': expected an integer"):
        Options(slots="two")
    with pytest.raises(ValueError, match=r"--harness-device 'tpu'"):
        Settings(session_id="s", session_dir=Path("s"), reference_root=Path("r"),
                 lease_dir=Path("l"), device="tpu")


def test_from_options_reads_each_option_and_derives_the_rest(tmp_path):
    options = Options(device="cpu", slots=3, timeout_s=12.0, launcher="auto",
                      slurm_args="--partition=x --qos=y", golden_dir="golden", nnodes=0)
    settings = Settings.from_options(options, tmp_path / "s", tmp_path / "r", "gw1")
    assert (settings.device, settings.slots, settings.timeout_s) == ("cpu", 3, 12.0)
    assert settings.launcher == "zygote"  # auto on CPU
    assert settings.slurm_args == ("--partition=x", "--qos=y")
    assert settings.golden_dir == Path("golden").resolve() and settings.golden_write_dir is None
    assert settings.nnodes == 1 and settings.calibrate_repeats == 0 and settings.worker == "gw1"
    assert settings.lease_dir == tmp_path / "s" / "leases" and settings.session_id == "s"


def test_the_record_is_the_resolved_settings_and_the_options_as_given(tmp_path):
    options = Options(device="cpu", slots=8, config="c.json", variables=("A=1",), workers=2,
                      marker="basic", golden_dir="golden")
    block = Settings.from_options(options, tmp_path / "s", tmp_path / "r").record(options)
    assert block["slots"] == 8 and block["device"] == "cpu" and block["launcher"] == "zygote"
    assert (block["workers"], block["marker"], block["keyword"]) == (2, "basic", None)
    assert block["config"] == "c.json" and block["variables"] == ["A=1"]
    assert block["golden_dir"] == str(Path("golden").resolve()) and block["slurm_args"] == []
    assert set(block) == {f.name for f in fields(Options)}


def test_flags_by_setting_name():
    assert (flag_of("slots"), flag_of("workers"), flag_of("launcher")) == (
        "--gpus", "-n", "--harness-launcher")
    with pytest.raises(KeyError, match="'gpu' is no setting"):
        flag_of("gpu")


def test_an_unknown_setting_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['gpus'\]"):
        Settings.derive(tmp_path, tmp_path, gpus=2)


def test_session_paths_and_overrides(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    named = named_configs([str(tmp_path / "a.json::x"), "tests", str(tmp_path / "a.json")])
    assert named == [(tmp_path / "a.json").resolve()]
    assert Options().config_path(named, tmp_path) == named[0]
    assert Options().config_path([], tmp_path) == tmp_path / "configs" / "test_config.json"
    assert Options(config="x.json").config_path(named, tmp_path) == Path("x.json").resolve()
    with pytest.raises(ValueError, match="one harness config per session; got"):
        Options().config_path(named_configs([str(tmp_path / "a.json"),
                                             str(tmp_path / "b.json")]), tmp_path)
    assert Options().output_dir(tmp_path, None, Path("out")) == tmp_path / "out"
    assert Options(output="o").output_dir(tmp_path, Path("e"), Path("out")) == Path("o").resolve()
    assert Options().reference_root(tmp_path) == tmp_path / "reference-cache"
    assert Options(infinitrain_build="b", variables=("X=1",)).overrides() == Overrides(
        variables={"X": "1"}, backend="infinitrain", build_dir=str(Path("b").resolve()))
    with pytest.raises(ValueError, match="--harness-var 'X': expected NAME=VALUE"):
        Options(variables=("X",)).overrides()


def test_calibrate_is_checked_on_its_own_and_with_golden():
    Options().check()
    with pytest.raises(ValueError, match="K >= 3"):
        Options(calibrate_repeats=2).check()
    with pytest.raises(ValueError, match="cannot be combined with --harness-golden"):
        Options(calibrate_repeats=3, golden_dir="g").check()


def test_a_path_option_in_two_words_outside_the_folder_is_what_pulls_the_rootdir(tmp_path):
    """pytest finds its rootdir from the command line's existing paths before the harness's
    options are known: `--harness-output /elsewhere` (existing) is read as one of them, `=`
    makes it one word. Only such values outside the invocation folder move the rootdir."""
    here, elsewhere = tmp_path / "project", tmp_path / "nightly"
    (here / "out").mkdir(parents=True)
    elsewhere.mkdir()
    assert paths_read_as_test_paths(["--harness-output", str(elsewhere), "--gpus", "8"],
                                    here) == [("--harness-output", str(elsewhere))]
    assert paths_read_as_test_paths([f"--harness-output={elsewhere}"], here) == []
    assert paths_read_as_test_paths(["--harness-output", "out"], here) == []  # inside
    assert paths_read_as_test_paths(["--harness-output", str(tmp_path / "none")], here) == []
    # a flag that takes no value: the path after it is pytest's own argument, not ours
    assert paths_read_as_test_paths(["--harness-golden-allow-mismatch", str(elsewhere)],
                                    here) == []
    assert paths_read_as_test_paths(["--harness-reference-cache", "../nightly"], here) == [
        ("--harness-reference-cache", "../nightly")]
    args = ["--harness-output", str(elsewhere), "--harness-config", str(elsewhere)]
    problem = rootdir_problem(args, here, tmp_path, None)
    assert problem.startswith(f"--harness-output {elsewhere}; --harness-config {elsewhere}: "
                              "pytest read these paths as a test path")
    assert f"took {tmp_path} as the rootdir and found no config file there" in problem
    assert problem.endswith(f"Write --harness-output={elsewhere}, --harness-config="
                            f"{elsewhere} (one word), or add --rootdir={here}")
    assert rootdir_problem(args, here, tmp_path, tmp_path / "pytest.ini") is None  # -c
    assert rootdir_problem([*args, "--rootdir", str(here)], here, here, None) is None
    assert rootdir_problem([*args, f"--rootdir={here}"], here, here, None) is None
    assert rootdir_problem([f"--harness-output={elsewhere}"], here, here, None) is None
