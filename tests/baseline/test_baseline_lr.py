"""The baseline check compares the printed lr of every step, beside the loss
(harness.baseline.live.judged): a schedule that drifts fails at the step where it drifts, with
the loss still inside its threshold; InfiniTrain's `{:.2e}` rounding at halves passes. No torch."""

from __future__ import annotations

from harness.baseline.live import judged
from harness.launch.backends import parse_step_lines
from harness.trainer.lr_schedule import LRSchedule

COSINE = LRSchedule.from_flags("cosine", 1e-5, 1e-6, 2, 0.0, 10, 10)
LINEAR = LRSchedule.from_flags("linear", 1e-5, 1e-6, 2, 0.0, 10, 10)


def _printed(lrs, losses=None) -> list[dict]:
    """Steps as InfiniTrain prints them (`{:.6f}` loss, `{:.2e}` lr), read back by the backend."""
    losses = losses or [5.0] * len(lrs)
    text = "\n".join(f"step {i:4d}/{len(lrs)} | train loss {loss:.6f} | lr {lr:.2e} | "
                     f"(10.00 ms | 100 tok/s)" for i, (lr, loss) in
                     enumerate(zip(lrs, losses), start=1))
    return parse_step_lines(text)


def _check(run_lrs, schedule=COSINE, steps=10):
    base = [schedule.printed(s) for s in range(1, steps + 1)]
    return judged("pytorch (live)", _printed(run_lrs), list(range(1, steps + 1)),
                  [5.0] * steps, "float32", 1, base_lrs=base)


def test_the_same_schedule_printed_passes_including_the_half_rounded_either_way():
    assert _check([COSINE.printed(s) for s in range(1, 11)]).status == "passed"
    linear = [LINEAR.printed(s) for s in range(1, 11)]
    assert linear[3] == 8.875e-06
    printed = _printed(linear)
    printed[3]["lr"] = 8.87e-06  # the real CPU build prints 8.87e-06, Python 8.88e-06
    check = judged("pytorch (live)", printed, list(range(1, 11)), [5.0] * 10, "float32", 1,
                   base_lrs=linear)
    assert check.status == "passed", check.lines()


def test_warmup_one_step_short_fails_at_step_2_with_the_loss_inside_its_threshold():
    short = LRSchedule.from_flags("cosine", 1e-5, 1e-6, 1, 0.0, 10, 10)  # W-1 warmup steps
    check = _check([short.printed(s) for s in range(1, 11)])
    assert check.status == "failed"
    assert check.verdict.ok  # the losses alone pass
    assert check.lr.first_diverging_step == 2
    assert "lr: first diverging step 2" in check.reason
    text = "\n".join(check.lines())
    assert "learning rate" in text and "step 2" in text
    assert check.record()["lr"]["first_diverging_step"] == 2


def test_a_cosine_that_stops_above_min_lr_fails_at_the_last_steps():
    floor = LRSchedule.from_flags("cosine", 1e-5, 2e-6, 2, 0.0, 10, 10)
    run = [floor.printed(s) for s in range(1, 11)]
    check = _check(run)
    assert check.status == "failed"
    assert check.lr.first_diverging_step >= 4 and check.lr.worst_step == 10


def test_a_warmup_step_printed_zero_is_exact():
    run = [COSINE.printed(s) for s in range(1, 11)]
    run[0] = 1e-9  # prints 1.00e-09, not 0.00e+00: the warmup did not start at lr_warmup_init
    check = _check(run)
    assert check.status == "failed" and check.lr.first_diverging_step == 1


def test_a_step_that_printed_no_lr_is_a_problem_never_a_pass():
    steps = _printed([1e-5] * 3)
    steps[1]["lr"] = float("nan")  # `lr nan`, or a column lost on one line
    check = judged("pytorch (live)", steps, [1, 2, 3], [5.0] * 3, "float32", 1,
                   base_lrs=[1e-5] * 3)
    assert check.status == "failed" and check.lr.problem
    assert "step 2" in check.lr.problem


def test_a_run_that_prints_no_lr_at_all_is_judged_on_its_loss_and_says_so():
    steps = [{"step": s, "loss": 5.0} for s in range(1, 4)]
    check = judged("pytorch (live)", steps, [1, 2, 3], [5.0] * 3, "float32", 1,
                   base_lrs=[1e-5] * 3)
    assert check.status == "passed" and check.lr is None
    assert check.note == "lr not compared: the run printed none"


def test_a_baseline_without_lrs_compares_the_loss_alone():
    check = judged("recorded.log", _printed([1e-5] * 3), [1, 2, 3], [5.0] * 3, "float32", 1)
    assert check.status == "passed" and check.lr is None and check.record()["lr"] is None
