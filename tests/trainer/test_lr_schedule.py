"""The bundled trainer's lr schedules against feat/lr_scheduler's own definition: its unit
tests' numbers, the printed lr of its config's lr_scheduler cases, and the edges (warmup 0,
decay iterations 0 or not above the warmup, the last step). No torch."""

from __future__ import annotations

import math

import pytest

from harness.contracts.flags import FlagError
from harness.trainer.flags import parse_flags
from harness.trainer.lr_schedule import LRSchedule


def _lrs(schedule: LRSchedule, steps: int) -> list[float]:
    return [schedule.lr(k) for k in range(steps)]


def test_the_branch_unit_tests_numbers():
    # feat/lr_scheduler@a7949ac:tests/optimizer/test_lr_scheduler.cc:248-249 (linear W2 D6),
    # :262 (cosine D4, after each Step), :275 (inverse-square-root W2 D10)
    linear = LRSchedule("linear", 1.0, min_lr=0.1, warmup_iters=2, decay_iters=6)
    assert _lrs(linear, 7) == pytest.approx([0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1])
    cosine = LRSchedule("cosine", 1.0, decay_iters=4)
    assert [cosine.lr(k) for k in (1, 2, 3, 4)] == pytest.approx(
        [0.853553, 0.5, 0.146447, 0.0], abs=1e-6)
    isr = LRSchedule("inverse-square-root", 1.0, warmup_iters=2, decay_iters=10)
    assert [isr.lr(k) for k in (1, 2, 3, 4, 5)] == pytest.approx(
        [0.5, 1.0, 0.8165, 0.7071, 0.6325], abs=1e-4)


# The lr_scheduler tag's printed lr per step (max 1e-5, min 1e-6, init 0, 10 steps), as the
# branch's formulas give it and `{:.2e}` prints it (/work/facts FACTS.md's table; 8.875e-06
# is a half and may print either way, so the values are compared unrounded here).
PRINTED = {
    "linear": [0.0, 5e-6, 1e-5, 8.875e-6, 7.75e-6, 6.625e-6, 5.5e-6, 4.375e-6, 3.25e-6,
               2.125e-6],
    "cosine": [0.0, 5e-6, 1e-5, 9.66e-6, 8.68e-6, 7.22e-6, 5.5e-6, 3.78e-6, 2.32e-6, 1.34e-6],
    "inverse-square-root": [0.0, 5e-6, 1e-5, 8.16e-6, 7.07e-6, 6.32e-6, 5.77e-6, 5.35e-6,
                            5.0e-6, 4.71e-6],
}


@pytest.mark.parametrize("style", sorted(PRINTED))
def test_the_configs_cases_print_the_branchs_lr(style):
    flags = parse_flags(["--learning_rate", "1e-5", "--min_lr", "1e-6", "--lr_decay_style",
                         style, "--lr_warmup_iters", "2", "--lr_decay_iters", "10",
                         "--num_iteration", "10"])
    schedule = flags.lr_schedule()
    printed = [schedule.printed(step) for step in range(1, 11)]
    for got, want in zip(printed, PRINTED[style]):
        half_unit = 0.5 * 10.0 ** (math.floor(math.log10(want)) - 2) if want else 0.0
        assert abs(got - want) <= half_unit * (1 + 1e-9), (style, got, want)


def test_none_and_constant_hold_the_flag_lr_and_none_checks_nothing():
    none = LRSchedule.from_flags("none", 1e-5, min_lr=5.0, warmup_iters=7, warmup_init=9.0,
                                 decay_iters=0, num_iteration=3)  # nullptr: no CHECKs run
    assert _lrs(none, 5) == [1e-5] * 5
    constant = LRSchedule.from_flags("constant", 1e-5, 1e-6, 0, 0.0, 0, 10)
    assert _lrs(constant, 12) == [1e-5] * 12  # min_lr and the decay never reached


def test_warmup_zero_starts_at_the_peak():
    for style in ("constant", "linear", "cosine", "inverse-square-root"):
        assert LRSchedule.from_flags(style, 1e-5, 1e-6, 0, 0.0, 10, 10).lr(0) == \
            pytest.approx(1e-5)


def test_warmup_from_its_init():
    schedule = LRSchedule.from_flags("linear", 1e-5, 1e-6, 4, 2e-6, 10, 10)
    assert _lrs(schedule, 5) == pytest.approx([2e-6, 4e-6, 6e-6, 8e-6, 1e-5])


def test_decay_iters_zero_spans_the_run_and_the_last_steps_reach_min():
    schedule = LRSchedule.from_flags("cosine", 1e-5, 1e-6, 2, 0.0, 0, 10)
    assert schedule.decay_iters == 10
    assert schedule.lr(10) == pytest.approx(1e-6)  # j = D': cos(pi) + 1 = 0
    assert schedule.lr(11) == 1e-6 and schedule.lr(50) == 1e-6
    linear = LRSchedule.from_flags("linear", 1e-5, 1e-6, 2, 0.0, 0, 10)
    assert linear.lr(10) == pytest.approx(1e-6) and linear.lr(30) == pytest.approx(1e-6)
    isr = LRSchedule.from_flags("inverse-square-root", 1e-5, 1e-6, 2, 0.0, 0, 10)
    assert isr.lr(10) == pytest.approx(1e-5 * math.sqrt(2 / 10))
    assert isr.lr(11) == 1e-6  # past D: min
    # The last step of a 10-step run prints lr(9).
    assert schedule.printed(10) == schedule.lr(9) != schedule.lr(10)


def test_inverse_square_root_is_floored_at_min():
    schedule = LRSchedule.from_flags("inverse-square-root", 1e-5, 6e-6, 1, 0.0, 100, 100)
    assert schedule.lr(1) == pytest.approx(1e-5)  # max * sqrt(1) / sqrt(1)
    assert schedule.lr(4) == 6e-6  # 1e-5 / sqrt(4) = 5e-6 < min


@pytest.mark.parametrize("args, named", [
    (("linear", 1e-5, 1e-6, 10, 0.0, 5, 10), "--lr_warmup_iters=10: expected < the decay "
                                             "iterations 5"),
    (("cosine", 1e-5, 1e-6, 10, 0.0, 0, 10), "--lr_warmup_iters=10: expected < the decay "
                                             "iterations 10"),
    (("linear", 1e-5, 2e-5, 0, 0.0, 0, 10), "--min_lr=2e-05: expected <= --learning_rate"),
    (("cosine", 1e-5, 0.0, 1, 3e-5, 0, 10), "--lr_warmup_init=3e-05: expected <= "),
    (("constant", 0.0, 0.0, 0, 0.0, 0, 10), "--learning_rate=0.0: expected > 0"),
])
def test_what_the_branch_checks_is_refused_naming_the_flag(args, named):
    with pytest.raises(FlagError, match=None) as raised:
        LRSchedule.from_flags(*args)
    assert named in str(raised.value)
    assert "lr_scheduler.cc:22-30" in str(raised.value)


def test_an_unknown_style_is_refused_before_a_model_is_built():
    flags = parse_flags(["--lr_decay_style", "step"])  # the binary's own validator decides
    with pytest.raises(FlagError, match="--lr_decay_style=step: expected one of none, "
                                        "constant, linear, cosine, inverse-square-root"):
        flags.lr_schedule()
