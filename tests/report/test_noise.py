"""Throughput differences are called only outside the spread of the timed steps; --compare
names the session settings that differ."""

from __future__ import annotations

from harness.report import build, read_session
from harness.report.case_view import view
from harness.results.noise import NOT_JUDGED, WITHIN_NOISE, judge, relative_error, spread_text
from harness.report.session_diff import compare, settings_differences

from .records import case


def test_spread_and_the_band():
    steady = {"step_times_ms": [100.0, 100.0, 100.0]}
    noisy = {"step_times_ms": [50.0, 100.0, 150.0]}
    assert relative_error(steady) == 0 and spread_text(steady) == "±0.0%"
    assert round(relative_error(noisy), 4) == round(50 / 100 / 3 ** 0.5, 4)
    assert spread_text({"step_times_ms": [1.0]}) == "–" == spread_text({})
    assert judge(steady, steady, 1.02).verdict == "faster"  # no noise at all: any change counts
    j = judge(steady, noisy, 1.3)
    assert j.verdict == WITHIN_NOISE and j.band_text == "±57.7%"
    assert judge(noisy, noisy, 0.1).verdict == "slower"
    assert judge({}, steady, 2.0).verdict == NOT_JUDGED
    assert judge(steady, steady, 1.04, floor=0.05).verdict == WITHIN_NOISE


def test_compare_calls_noise_within_noise_and_names_settings(tmp_path):
    old = [case("basic", "gpt2", "pp2", tokens=1000.0),
           case("basic", "gpt2", "pp4", tokens=1000.0)]
    new = [case("basic", "gpt2", "pp2", tokens=1600.0,
                step_times_ms=[100.0, 400.0, 200.0, 500.0]),  # +60% but all over the place
           case("basic", "gpt2", "pp4", tokens=1300.0)]
    result = compare([view(r) for r in old], [view(r) for r in new], "old", "new",
                     {"args": ["--gpus", "8"], "torch": "2.13.0"},
                     {"args": ["--gpus=2", "-n", "2"], "torch": "2.13.0"})
    assert [n.case_id for _, n, _ in result.faster] == ["pp4"]
    assert [n.case_id for _, n, _ in result.unjudged] == ["pp2"]
    assert result.settings == [("--gpus", "8", "2"), ("-n", "not given", "2")]
    assert settings_differences({}, {}, [{"device": "cpu"}], [{"device": "cuda"}]) == [
        ("device", "cpu", "cuda")]
    from harness.report.session_diff_markdown import comparison

    text = "\n".join(comparison(result))
    assert "different settings**: --gpus 8 → 2; -n not given → 2" in text
    assert "| +60.0%   |" in text and "within noise" in text
    header = [line for line in text.splitlines() if line.startswith("| case ")][-1]
    assert [c.strip() for c in header.strip("|").split("|")][-2:] == ["noise band", "verdict"]


def test_a_session_of_one_case_says_case(tmp_path):
    from .records import write

    path = write(tmp_path / "s" / "results.jsonl", [case("basic", "gpt2", "pp2")])
    report = build(read_session([path]), tmp_path / "r.md", with_plots=False)
    assert "1 case recorded:" in report.markdown
