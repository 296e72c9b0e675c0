"""Settings are built from the pytest options in one place (Settings.from_options), each field
naming its option: no option can be read by one part and forgotten by another."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner.settings import Settings


def test_every_setting_option_is_declared_by_the_plugin(pytestconfig):
    for option in Settings.options():  # this session's own options: the plugin's, loaded
        pytestconfig.getoption(option)  # raises ValueError for an undeclared one


def test_from_options_reads_each_option_and_derives_the_rest(tmp_path):
    given = {option: None for option in Settings.options()}
    given.update({"--harness-device": "cpu", "--gpus": 3, "--harness-timeout": 12.0,
                  "--harness-launcher": "auto", "--harness-slurm-args": "--partition=x --qos=y",
                  "--harness-golden": "golden", "--harness-nnodes": 0})
    settings = Settings.from_options(given.__getitem__, tmp_path / "s", tmp_path / "r", "gw1")
    assert (settings.device, settings.slots, settings.timeout_s) == ("cpu", 3, 12.0)
    assert settings.launcher == "zygote"  # auto on CPU
    assert settings.slurm_args == ("--partition=x", "--qos=y")
    assert settings.golden_dir == Path("golden").resolve() and settings.golden_write_dir is None
    assert settings.nnodes == 1 and settings.calibrate_repeats == 0 and settings.worker == "gw1"
    assert settings.lease_dir == tmp_path / "s" / "leases" and settings.session_id == "s"


def test_an_unknown_setting_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['gpus'\]"):
        Settings.derive(tmp_path, tmp_path, gpus=2)
