"""harness.compare.calibration: the clamp (never below the default, an error above the ceiling,
a 1e-4 stage bug still failing at the ceiling), the file's validation, and the lookup that
reports a calibration of another host, build or dtype instead of using it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from harness.compare.calibration import (
    CAUGHT,
    CEILING,
    FORMAT,
    MARGIN,
    Calibration,
    CalibrationError,
    CalibrationLookup,
    calibrated_thresholds,
    calibration_path,
    check_repeats,
    file_name,
    load_calibration,
)
from harness.compare.verdict import passes, relative_error, relative_thresholds

F32 = relative_thresholds("float32")
BF16 = relative_thresholds("bfloat16")


def calibration(**changes) -> Calibration:
    values = dict(trainer="command", trainer_version="fake-1", device="cuda", host="gpu-7",
                  dtype="float32", repeats=3, cases=4, loss_noise=1e-7, gradients_noise=2e-6,
                  worst_parameter="h.3.mlp.c_fc.weight", worst_case="basic/gpt2/tp2",
                  created_at="2026-01-01T00:00:00+0000")
    values.update(changes)
    return Calibration(**values)


# ---------------------------------------------------------------------- the clamp


def test_the_ceilings_sit_between_the_defaults_and_the_bugs_they_must_catch():
    for dtype in ("float32", "bfloat16"):
        default, ceiling = relative_thresholds(dtype), CEILING[dtype]
        assert default.loss <= ceiling.loss and default.gradients <= ceiling.gradients
    assert CEILING["float32"].gradients < 1e-4 and CEILING["float32"].loss < 1e-4
    assert CEILING["bfloat16"].gradients < 0.125  # a dropped microbatch of 8
    assert MARGIN == 10


def test_noise_times_the_margin_is_the_threshold_between_default_and_ceiling():
    thresholds, stored = calibrated_thresholds(F32, calibration(gradients_noise=3e-6))
    assert thresholds.gradients == pytest.approx(3e-5)
    assert thresholds.loss == F32.loss  # 1e-7 x 10 is below the default
    assert stored == {"file": None, "gradients_noise": 3e-6, "loss_noise": 1e-7,
                      "thresholds": thresholds.to_dict(), "problem": None}


def test_noise_below_the_default_over_the_margin_gives_the_default():
    thresholds, stored = calibrated_thresholds(F32, calibration(gradients_noise=1e-9,
                                                                loss_noise=0.0))
    assert thresholds == F32
    assert stored["thresholds"] == F32.to_dict() and stored["gradients_noise"] == 1e-9


def test_no_calibration_is_the_default_and_keeps_a_lookups_problem():
    assert calibrated_thresholds(BF16, None) == (BF16, {
        "file": None, "gradients_noise": None, "loss_noise": None,
        "thresholds": BF16.to_dict(), "problem": None})
    lookup = CalibrationLookup(None, "made on another host")
    assert calibrated_thresholds(BF16, lookup)[1]["problem"] == "made on another host"


def test_gradient_noise_above_the_ceiling_is_an_error_naming_file_parameter_and_case(tmp_path):
    path = calibration(gradients_noise=3e-4).write(tmp_path)
    with pytest.raises(CalibrationError) as error:
        calibrated_thresholds(F32, Calibration.read(path))
    text = str(error.value)
    assert str(path) in text and "gradient noise 0.0003" in text
    assert "h.3.mlp.c_fc.weight" in text and "basic/gpt2/tp2" in text
    assert "ceiling 5e-05" in text and "1e-4 stage bug" in text


def test_loss_noise_above_the_ceiling_is_an_error_too():
    with pytest.raises(CalibrationError, match="loss noise 0.01.*ceiling 0.01 of bfloat16"):
        calibrated_thresholds(BF16, calibration(dtype="bfloat16", loss_noise=1e-2))


@pytest.mark.parametrize("what", ["gradients", "loss"])
@pytest.mark.parametrize("share", [1.5, 3, 6, 9.9])  # noise = ceiling x share / MARGIN
def test_float32_noise_between_a_tenth_of_the_ceiling_and_the_ceiling_is_refused(what, share):
    """Planted: the ceiling checked on the raw noise instead of noise x MARGIN. Float32 noise of
    3e-5 (below the 5e-5 ceiling, above ceiling / 10) would then give a 3e-4 threshold, which
    lets a 1e-4 stage bug pass; it must be an error, and no threshold above the ceiling is ever
    handed out."""
    limit = getattr(CEILING["float32"], what)
    noise = limit * share / MARGIN
    assert limit / MARGIN < noise < limit
    with pytest.raises(CalibrationError, match=f"above the ceiling {limit:.3g} of float32"):
        calibrated_thresholds(F32, calibration(**{f"{what}_noise": noise}))
    thresholds, _ = calibrated_thresholds(F32, calibration(**{f"{what}_noise": limit / MARGIN}))
    assert getattr(thresholds, what) <= limit * (1 + 1e-12)


def test_3e5_float32_gradient_noise_gives_no_3e4_threshold():
    """Planted as above (the raw noise against the ceiling): the issue's example point."""
    with pytest.raises(CalibrationError, match="gradient noise 3e-05.*0.0003, above the ceiling"):
        calibrated_thresholds(F32, calibration(gradients_noise=3e-5))


def test_a_1e4_stage_bug_still_fails_at_the_ceiling():
    # The loosest calibration that is accepted: noise x MARGIN exactly at the ceiling.
    ceiling = CEILING["float32"]
    thresholds, _ = calibrated_thresholds(F32, calibration(
        gradients_noise=ceiling.gradients / MARGIN, loss_noise=ceiling.loss / MARGIN))
    assert thresholds.gradients == pytest.approx(ceiling.gradients)
    ref = np.random.default_rng(0).standard_normal(1000)
    got = ref * (1 + 1e-4)  # one stage's gradients scaled by 1 + 1e-4
    error = relative_error(float(np.linalg.norm(got - ref)), float(np.linalg.norm(ref)))
    assert error == pytest.approx(1e-4)
    assert not passes(error, thresholds.gradients)
    assert not passes(1e-4, thresholds.loss)  # a loss 1e-4 off, relative
    bf16, _ = calibrated_thresholds(BF16, calibration(
        dtype="bfloat16", gradients_noise=CEILING["bfloat16"].gradients / MARGIN))
    assert not passes(0.125, bf16.gradients)  # a dropped microbatch of 8


# ---------------------------------------------------------------------- the file


def test_a_file_round_trips_with_its_format_first(tmp_path):
    path = calibration().write(tmp_path)
    assert path == tmp_path / "calibration" / "fake-1-cuda-float32.json"
    data = json.loads(path.read_text())
    assert list(data)[0] == "format" and data["format"] == FORMAT
    assert set(data) == {"format", "trainer", "trainer_version", "device", "host", "dtype",
                         "repeats", "cases", "loss_noise", "gradients_noise",
                         "worst_parameter", "worst_case", "created_at"}
    assert Calibration.read(path) == calibration()
    assert Calibration.read(path).path == path


def test_file_names_are_safe_for_any_version():
    assert file_name("command-abc/../x y", "cpu", "bfloat16") == \
        "command-abc_.._x_y-cpu-bfloat16.json"


def write_raw(tmp_path, **changes):
    data = calibration().to_json()
    data.update(changes)
    path = calibration_path(tmp_path, "fake-1", "cuda", "float32")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_an_unknown_key_is_an_error_naming_it_and_the_file(tmp_path):
    path = write_raw(tmp_path, sigma=1.0)
    with pytest.raises(CalibrationError, match=r"unknown key\(s\) 'sigma'") as error:
        load_calibration(tmp_path, "fake-1", "cuda", "float32", host="gpu-7")
    assert str(path) in str(error.value)


def test_a_wrong_format_is_an_error(tmp_path):
    path = write_raw(tmp_path, format="harness.calibration/0")
    with pytest.raises(CalibrationError, match="format is 'harness.calibration/0', expected "
                                               "'harness.calibration/1'"):
        Calibration.read(path)


def test_a_missing_key_or_junk_is_an_error(tmp_path):
    path = write_raw(tmp_path)
    data = json.loads(path.read_text())
    del data["host"]
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="missing key.*'host'"):
        Calibration.read(path)
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match="not a readable calibration file"):
        Calibration.read(path)


@pytest.mark.parametrize("changes, expected", [
    ({"repeats": 2}, "repeats is 2, expected an integer >= 3"),
    ({"gradients_noise": -1.0}, "gradients_noise is -1.0, expected a finite number >= 0"),
    ({"loss_noise": "inf"}, "loss_noise is 'inf'"),
    ({"dtype": "float16"}, "dtype is 'float16', expected one of"),
    ({"device": "tpu"}, "device is 'tpu'"),
    ({"host": ""}, "host is '', expected a non-empty string"),
])
def test_values_are_checked_on_construction(tmp_path, changes, expected):
    path = write_raw(tmp_path, **changes)
    with pytest.raises(CalibrationError, match=expected) as error:
        Calibration.read(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("k", [0, 1, 2, -3])
def test_k_below_3_is_refused(k):
    with pytest.raises(ValueError, match=f"a calibration needs K >= 3 repeats to estimate "
                                         f"anything; got {k}"):
        check_repeats(k)
    assert check_repeats(3) == 3


# ---------------------------------------------------------------------- the lookup


def test_the_calibration_of_this_host_build_device_and_dtype_is_used(tmp_path):
    path = calibration().write(tmp_path)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", trainer="command",
                              host="gpu-7")
    assert lookup.calibration == calibration() and lookup.problem is None
    assert lookup.file == path
    _, stored = calibrated_thresholds(F32, lookup)
    assert stored["file"] == str(path)


def test_none_at_all_is_the_default_without_a_problem(tmp_path):
    assert load_calibration(tmp_path, "fake-1", "cuda", None) == CalibrationLookup(None)


def test_another_host_is_reported_not_used(tmp_path):
    path = calibration().write(tmp_path)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", host="gpu-8")
    assert lookup.calibration is None and lookup.file == path
    assert str(path) in lookup.problem
    assert "host 'gpu-7', this session 'gpu-8'" in lookup.problem
    assert "not used, the default thresholds are" in lookup.problem


def test_another_build_is_reported_not_used(tmp_path):
    path = calibration(trainer_version="fake-0").write(tmp_path)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", trainer="command",
                              host="gpu-7")
    assert lookup.calibration is None
    assert f"the calibration {path} is of trainer build 'fake-0', not this session's " \
           f"'fake-1'" in lookup.problem
    # ... but not a file of another trainer altogether
    assert load_calibration(tmp_path, "fake-1", "cuda", "float32", trainer="infinitrain",
                            host="gpu-7") == CalibrationLookup(None)


def test_another_dtype_is_reported_not_used(tmp_path):
    path = calibration(dtype="bfloat16").write(tmp_path)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", host="gpu-7")
    assert lookup.calibration is None
    assert f"the calibration {path} is for bfloat16, not float32" in lookup.problem


def test_a_file_whose_content_is_for_another_dtype_is_reported(tmp_path):
    # renamed or copied by hand: what it says it is wins over its name
    source = calibration(dtype="bfloat16").write(tmp_path)
    target = calibration_path(tmp_path, "fake-1", "cuda", "float32")
    source.rename(target)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", host="gpu-7")
    assert lookup.calibration is None and "dtype 'bfloat16', this session 'float32'" in \
        lookup.problem


def test_the_module_is_torch_free():
    code = ("import sys, harness.compare.calibration; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------- from the mutation check
# (benchmarks/mutation.py): messages and edges the tests above did not pin down


def test_a_ceiling_error_without_a_file_parameter_or_case_says_so():
    unsaved = calibration(gradients_noise=3e-4, worst_parameter=None, worst_case=None)
    with pytest.raises(CalibrationError) as error:
        calibrated_thresholds(F32, unsaved)
    assert str(error.value).startswith(
        "the calibration (unsaved) measured gradient noise 0.0003 at an unnamed parameter: x "
        "the margin 10 that is 0.003, above the ceiling 5e-05 of float32 gradient thresholds, "
        "so no threshold both passes this machine's noise and catches a 1e-4 stage bug"), error
    with pytest.raises(CalibrationError) as error:  # the loss names no parameter
        calibrated_thresholds(F32, calibration(loss_noise=1e-5))
    assert str(error.value).startswith(
        "the calibration (unsaved) measured loss noise 1e-05: x the margin 10 that is 0.0001, "
        "above the ceiling 5e-05 of float32 loss thresholds, so no threshold both passes this "
        "machine's noise and catches a 1e-4 loss error"), error


def test_every_ceiling_names_the_bug_it_keeps_failing():
    assert set(CAUGHT) == {(dtype, what) for dtype in CEILING for what in ("loss", "gradients")}


def test_k_must_be_an_integer():
    for k in ("3", 3.0, None):
        with pytest.raises(ValueError, match=f"K >= 3 repeats to estimate anything; got {k}"):
            check_repeats(k)


@pytest.mark.parametrize("changes, expected", [
    ({"host": None}, "calibration: host is None, expected a non-empty string$"),
    ({"worst_case": ""}, "calibration: worst_case is '', expected a non-empty string or null$"),
    ({"worst_parameter": 7}, "calibration: worst_parameter is 7, expected a non-empty string "
                             "or null$"),
    ({"repeats": 3.0}, r"calibration: repeats is 3.0, expected an integer >= 3 \(a calibration "
                       r"needs K >= 3 repeats to estimate anything\)$"),
    ({"cases": -1}, "calibration: cases is -1, expected an integer >= 0$"),
    ({"cases": 4.0}, "calibration: cases is 4.0, expected an integer >= 0$"),
    ({"cases": True}, "calibration: cases is True, expected an integer >= 0$"),
    ({"gradients_noise": True}, "calibration: gradients_noise is True, expected a finite "
                                "number >= 0 or null$"),
    ({"format": "harness.calibration/0"}, "calibration: format is 'harness.calibration/0', "
                                          "expected 'harness.calibration/1'$"),
])
def test_an_unsaved_calibrations_errors_name_it_calibration(changes, expected):
    with pytest.raises(CalibrationError, match=expected):
        calibration(**changes)


def test_edges_that_are_accepted():
    made = calibration(device="cpu", cases=0, worst_parameter=None, worst_case=None,
                       loss_noise=None)
    assert (made.device, made.cases, made.worst_parameter, made.loss_noise) == ("cpu", 0, None,
                                                                                None)


def test_from_json_errors_name_the_keys_and_the_source():
    data = calibration().to_json()
    with pytest.raises(CalibrationError) as error:
        Calibration.from_json({**data, "sigma": 1, "mu": 2})
    assert str(error.value) == (
        "calibration: unknown key(s) 'mu', 'sigma'; a harness.calibration/1 file has trainer, "
        "trainer_version, device, host, dtype, repeats, cases, loss_noise, gradients_noise, "
        "worst_parameter, worst_case, created_at, format")
    del data["host"], data["cases"]
    with pytest.raises(CalibrationError, match=r"^calibration: missing key\(s\) 'host', "
                                               r"'cases'$"):
        Calibration.from_json(data)
    with pytest.raises(CalibrationError, match="^here: a calibration is a JSON object, not "
                                               "list$"):
        Calibration.from_json([data], "here")


def test_calibrations_share_their_folder_and_are_written_readable(tmp_path):
    first = calibration().write(tmp_path)
    second = calibration(dtype="bfloat16").write(tmp_path)  # the folder exists by now
    assert first.parent == second.parent and Calibration.read(second).dtype == "bfloat16"
    text = first.read_text()
    assert text == json.dumps(calibration().to_json(), indent=2) + "\n"
    assert [p.name for p in first.parent.iterdir() if p.name.startswith(".")] == []


def test_the_dtype_looked_up_is_the_one_given_float32_when_none(tmp_path):
    bf16 = calibration(dtype="bfloat16").write(tmp_path)
    f32 = calibration().write(tmp_path)
    assert load_calibration(tmp_path, "fake-1", "cuda", "bfloat16", host="gpu-7").file == bf16
    assert load_calibration(tmp_path, "fake-1", "cuda", None, host="gpu-7").file == f32


def test_a_file_that_fits_nothing_of_this_session_names_every_difference(tmp_path):
    source = calibration(trainer="other", trainer_version="fake-0", device="cpu").write(tmp_path)
    path = calibration_path(tmp_path, "fake-1", "cuda", "float32")
    source.rename(path)
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", trainer="command",
                              host="gpu-8")
    assert lookup.calibration is None and lookup.file == path
    assert lookup.problem == (
        f"the calibration {path} was made for another environment (host 'gpu-7', this session "
        f"'gpu-8'; trainer build 'fake-0', this session 'fake-1'; device 'cpu', this session "
        f"'cuda'; trainer 'other', this session 'command'): not used, the default thresholds "
        f"are")


def test_the_lookup_reads_past_files_that_are_not_this_sessions_concern(tmp_path):
    folder = tmp_path / "calibration"
    folder.mkdir()
    (folder / "a.json").write_text("{not json")  # unreadable: its own lookup reports it
    calibration(trainer="infinitrain", trainer_version="b-build").write(tmp_path)  # another trainer
    calibration(device="cpu").write(tmp_path)  # this build and dtype on another device
    calibration(trainer_version="fake-0", device="cpu").write(tmp_path)  # another build there
    calibration(trainer_version="fake-0", device="cpu", dtype="bfloat16").write(tmp_path)
    other_build = calibration(trainer_version="fake-0").write(tmp_path)
    other_dtype = calibration(dtype="bfloat16").write(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "a.json", "b-build-cuda-float32.json", "fake-0-cpu-bfloat16.json",
        "fake-0-cpu-float32.json", "fake-0-cuda-float32.json", "fake-1-cpu-float32.json",
        "fake-1-cuda-bfloat16.json"]
    lookup = load_calibration(tmp_path, "fake-1", "cuda", "float32", trainer="command",
                              host="gpu-7")
    assert lookup == CalibrationLookup(None, (
        f"the calibration {other_build} is of trainer build 'fake-0', not this session's "
        f"'fake-1' (run --harness-calibrate on this build); the calibration {other_dtype} is "
        f"for bfloat16, not float32: not used, the default thresholds are"), None)


def test_a_kind_of_noise_not_measured_keeps_the_default_and_the_other_is_still_calibrated():
    """Mutants calibrated_thresholds 32 (the default replaced by None) and 33 (`continue` made
    `break`, leaving the gradients unchosen) survived every test: no calibration lacked its
    loss noise (a trainer that prints no loss comparison measured none)."""
    thresholds, stored = calibrated_thresholds(
        F32, calibration(loss_noise=None, gradients_noise=3e-6))
    assert thresholds.loss == F32.loss
    assert thresholds.gradients == pytest.approx(3e-6 * MARGIN)
    assert stored["thresholds"] == {"loss": F32.loss, "gradients": pytest.approx(3e-6 * MARGIN)}


def test_a_file_name_keeps_a_versions_capitals_and_names_an_empty_one():
    """Mutants file_name 10 (capitals made lower case in the kept set) and 14 (an empty
    version's stand-in changed) survived: no version had a capital letter or was empty."""
    assert file_name("Fake-1+ABC", "cpu", "float32") == "Fake-1+ABC-cpu-float32.json"
    assert file_name("", "cuda", "bfloat16") == "_-cuda-bfloat16.json"
