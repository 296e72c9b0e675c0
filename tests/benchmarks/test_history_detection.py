"""benchmarks/history_detection.py: its own logic (arguments, the detection table, the
synthetic year it renders, the noise table read from a history), small and in process; no
trainer run and no timing asserted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import history_detection as bench  # noqa: E402

from harness.history import findings  # noqa: E402
from harness.history.store import append_rows, history_path, read_history  # noqa: E402
from tests.history.nights import row  # noqa: E402


def test_arguments_are_checked():
    a = bench.parse_args(["detect", "--sigma", "0.01"])
    assert (a.command, a.sigma, a.step, a.series) == ("detect", 0.01, 0.05, 1000)
    assert bench.parse_args(["render"]).nights == 365
    with pytest.raises(SystemExit):
        bench.parse_args(["render", "--cases", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["noise"])  # --out is required


def test_the_detection_table_has_a_row_per_threshold_and_finds_a_clear_step():
    table = bench.detection(sigma=0.005, step=0.05, n=40, seed=3)
    assert [r[0] for r in table] == [f"{z:g}" + (" (STEP_Z)" if z == findings.STEP_Z else "")
                                     for z in bench.Z_VALUES]
    chosen = next(r for r in table if "STEP_Z" in r[0])
    by_night = [float(x.rstrip("%")) for x in chosen[1:4]]
    assert by_night == sorted(by_night) and by_night[-1] == 100.0  # 10 sigma: always found
    assert float(chosen[4]) <= 2.5  # at most one false alarm in 40 quiet series


def test_the_threshold_rule_finds_a_step_beyond_its_share_and_alarms_on_rare_slow_nights():
    """The comparison rule: a 5% step in 0.5% noise makes three nights each at least 3% slower
    (always found), mostly at least 4% slower, and seldom each at least 5% slower; quiet nights
    of 0.5% noise never all fall 3% (no alarm), while nights of which 30% are 6% slow do,
    three in a row, in many of the series."""
    table = bench.threshold_rule(0.005, 0.05, n=200, seed=1)
    assert [r[0] for r in table] == [f"{x:.1%}" for x in bench.THRESHOLD_SHARES]
    found = {r[0]: float(r[1].rstrip("%")) for r in table}
    assert found["3.0%"] == 100.0 and found["4.0%"] >= 85.0 and found["5.0%"] < 70.0
    assert all(float(r[2]) == 0.0 for r in table)
    slow_nights = np.array([0.0] * 7 + [math.log(0.94)] * 3)  # resampled: 30% of nights slow
    alarms = {r[0]: float(r[2]) for r in bench.threshold_rule(slow_nights, 0.05, 200, 1)}
    assert alarms["4.0%"] > 20.0 and alarms["5.0%"] > 20.0


def test_a_step_is_timed_from_its_first_night():
    values = np.array([1000.0] * 20 + [900.0] * 3)
    # flat before: one night after is not enough (MIN_AFTER), two are
    assert bench.nights_to_find(values, 20, findings.STEP_Z) == 2
    assert bench.nights_to_find(np.array([1000.0] * 23), 20, findings.STEP_Z) is None


def test_the_synthetic_year_is_a_valid_history(tmp_path):
    written = bench.synthetic_history(tmp_path, nights=3, cases=8)
    history = read_history(history_path(tmp_path))
    assert written == 24 and len(history.rows) == 24 and history.notes == []
    assert {r.tag for r in history.rows} == {"basic", "pipeline", "tensor", "checkpoint"}
    assert len({r.session for r in history.rows}) == 3


def test_the_noise_table_reads_each_case_from_the_history(tmp_path):
    rng = np.random.default_rng(0)
    append_rows(history_path(tmp_path), [
        row(i, name=name, tokens_per_s=float(1000 * np.exp(rng.normal(0, 0.02))))
        for i in range(12) for name in ("basic/gpt2/1", "basic/llama3/1")]
        + [row(12, "failed", name="basic/gpt2/1", tokens_per_s=10.0)])  # not a passed night
    table, worst = bench.noise_table(tmp_path)
    assert [r[0] for r in table] == ["basic/gpt2/1", "basic/llama3/1"]
    assert [r[1] for r in table] == [12, 12]
    assert 0.005 < worst < 0.06 and f"{worst:.4f}" == max(r[3] for r in table)


def test_measured_noise_is_resampled_as_it_was_measured(tmp_path):
    """Two levels 40% apart (a bimodal VM) stay two levels: the pool holds both deviations."""
    append_rows(history_path(tmp_path), [row(i, tokens_per_s=4000.0 if i % 2 else 5600.0)
                                         for i in range(9)])
    pool = bench.measured_pool(tmp_path)
    assert sorted(set(np.round(pool, 6))) == [round(np.log(4000 / 5600), 6), 0.0]
    drawn = bench.series(np.random.default_rng(0), pool, 50, None, 1.0)
    assert set(np.round(drawn)) == {714.0, 1000.0}  # 1000 x exp(each deviation)
    with pytest.raises(SystemExit, match="no case with two passed nights"):
        bench.measured_pool(tmp_path / "empty")


def test_the_render_is_timed_cold_nightly_and_again_and_the_nightly_renders_every_night(tmp_path):
    bench.synthetic_history(tmp_path, nights=3, cases=4)
    whole = history_path(tmp_path).read_bytes()
    table = bench.render_table(tmp_path, cases=4, repeats=1)
    assert [(r[0], r[1]) for r in table] == [
        (s, p) for s in ("first read (no cache)", "the nightly (one night appended)",
                         "again (nothing new)") for p in ("with plots", "--no-plots")]
    assert all(float(r[2]) > 0 for r in table)
    assert [r[5] for r in table[::2]] == [4, 4, 4]  # a figure per tag x model drawn
    # each situation rendered all 3 nights: the appended night was read after the cache
    assert all(r[6].startswith("history: ") and "(3 sessions, 4 cases" in r[6] for r in table)
    assert history_path(tmp_path).read_bytes() == whole
    assert history_path(tmp_path).with_name(bench.CACHE).is_file()
