"""The torch-free per-rank orders against torch's own, action for action, and the simulator on
cases whose step time is known by hand."""

import pytest

from harness.layout.schedules import Action, chunk_order_kind, rank_orders
from harness.layout.simulate import ScheduleDeadlock, peak_in_flight, simulate

SHAPES = [(pp, vpp, m) for pp in (2, 3, 4) for vpp in (2, 3) for m in (1, 2, 3, 4, 6, 8, 12)]


def _torch_orders(cls, pp, n_local, m, **attributes):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    schedule = object.__new__(getattr(schedules, cls))  # only the order arithmetic is used
    schedule.pp_group_size, schedule._n_microbatches = pp, m
    for name, value in attributes.items():
        setattr(schedule, name, value)
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    return [[Action(a.stage_index, kinds[a.computation_type.name], a.microbatch_index)
             for a in schedule._calculate_single_rank_operations(rank) if a is not None]
            for rank in range(pp)]


@pytest.mark.parametrize("pp, vpp, m", [s for s in SHAPES if s[2] % max(1, s[2] // s[0]) == 0])
def test_interleaved_1f1b_is_torchs(pp, vpp, m):
    rounds = max(1, m // pp)
    expected = _torch_orders("ScheduleInterleaved1F1B", pp, vpp, m, n_local_stages=vpp,
                             number_of_rounds=rounds, microbatches_per_round=m // rounds)
    assert rank_orders("Interleaved1F1B", [g % pp for g in range(pp * vpp)], pp, m) == expected


@pytest.mark.parametrize("pp, vpp, m", SHAPES)
def test_looped_bfs_is_torchs(pp, vpp, m):
    expected = _torch_orders("ScheduleLoopedBFS", pp, vpp, m, _stages=[None] * vpp)
    assert rank_orders("LoopedBFS", [g % pp for g in range(pp * vpp)], pp, m) == expected


@pytest.mark.parametrize("pp, m", [(pp, m) for pp in (2, 3, 4) for m in (1, 2, 4, 5, 8, 12)])
def test_zbv_is_torchs(pp, m):
    expected = _torch_orders("ScheduleZBVZeroBubble", pp, 2, m, num_stages=2 * pp)
    stages = list(range(pp)) + list(range(pp - 1, -1, -1))
    assert chunk_order_kind(stages, pp) == "v-shape"
    assert rank_orders("ZBVZeroBubble", stages, pp, m) == expected


def test_1f1b_is_torchs_loop():
    # Schedule1F1B has no action list to compare with (its _get_pipeline_order is a drawing that
    # starts the last rank at microbatch 1); its loop runs pp - rank forwards, then a backward
    # and a forward in turn, then the backwards left.
    def text(order):
        return " ".join(f"{a.kind}{a.microbatch}" for a in order)

    orders = rank_orders("1F1B", [0, 1, 2], 3, 5)
    assert [text(o) for o in orders] == ["F0 F1 F2 B0 F3 B1 F4 B2 B3 B4",
                                         "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4",
                                         "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"]
    assert text(rank_orders("1F1B", [0, 1], 2, 1)[0]) == "F0 B0"


def test_gpipe_is_the_trainers():
    from harness.trainer.parallel.schedules import gpipe_actions

    stages = [0, 1, 1, 0, 2, 2]
    ours = rank_orders("GPipe", stages, 3, 4)
    theirs = gpipe_actions(stages, 3, 4)
    assert [[(a.chunk, a.microbatch) for a in o] for o in ours] == \
        [[(a.stage_index, a.microbatch_index) for a in theirs[r]] for r in range(3)]


def test_a_schedule_that_does_not_fit_the_order_is_refused():
    with pytest.raises(ValueError, match="does not run a round-robin"):
        rank_orders("1F1B", [0, 1, 0, 1], 2, 4)
    with pytest.raises(ValueError, match="not simulated"):
        rank_orders("DualPipeV", [0, 1, 1, 0], 2, 4)


def test_1f1b_step_time_by_hand():
    # pp 2, 4 microbatches, F = 1, B = 2 on both stages: the first forward waits one F, the
    # last backward of stage 0 comes one B after stage 1's: 4 x (1 + 2) + 1 + 2 = 15.
    sim = simulate(rank_orders("1F1B", [0, 1], 2, 4), [0, 1], [1, 1], [2, 2])
    assert sim.step_time == pytest.approx(15)
    assert sim.rank_busy == (12, 12)
    # A heavier last stage paces the step: 4 x (1 + 2) x 2 + 1 + 2 = 27.
    assert simulate(rank_orders("1F1B", [0, 1], 2, 4), [0, 1], [1, 2], [2, 4]).step_time == pytest.approx(27)


def test_the_first_chunk_runs_its_whole_backward_as_w():
    # Like ZBV's cool-down: rank 0 runs both I's, then both W's; I(0, 1) waits for stage 1's
    # second backward, which ends at 7 (F = 1, B = 4 on chunk 0 and 2 on chunk 1).
    orders = [[Action(0, "F", 0), Action(0, "F", 1), Action(0, "I", 0), Action(0, "I", 1),
               Action(0, "W", 0), Action(0, "W", 1)],
              [Action(1, "F", 0), Action(1, "B", 0), Action(1, "F", 1), Action(1, "B", 1)]]
    # torch skips chunk 0's I (its input, the token ids, takes no gradient): both W's, 4 each,
    # start after the wait, at 7: 15. Split half and half, 2 + 2 of chunk 0's work would run
    # before the wait: 13.
    assert simulate(orders, [0, 1], [1, 1], [4, 2]).step_time == pytest.approx(15)
    # On any other chunk the split holds: the same orders one chunk further (0 -> 1, 1 -> 2).
    shifted = [[Action(g + 1, k, m) for g, k, m in o] for o in orders]
    fed = [Action(0, "F", 0), Action(0, "F", 1)]
    assert simulate([fed + shifted[0], shifted[1]], [0, 0, 1], [0, 1, 1], [0, 4, 2]).step_time \
        == pytest.approx(13)


def test_communication_delay_and_deadlock():
    orders = rank_orders("GPipe", [0, 1], 2, 1)
    assert simulate(orders, [0, 1], [1, 1], [1, 1], comm=0.5).step_time == pytest.approx(5)
    # Stage 0 waits for a gradient stage 1 only sends after a forward stage 0 never runs.
    bad = [[Action(0, "B", 0), Action(0, "F", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    with pytest.raises(ScheduleDeadlock, match="wait on each other"):
        simulate(bad, [0, 1], [1, 1], [1, 1])


def test_peak_in_flight_follows_the_order():
    one_f_one_b = rank_orders("1F1B", [0, 1], 2, 8)
    gpipe = rank_orders("GPipe", [0, 1], 2, 8)
    # 1F1B: stage i holds pp - i microbatches at once; GPipe holds them all.
    assert [peak_in_flight(o, [3.0, 5.0]) for o in one_f_one_b] == [6.0, 5.0]
    assert [peak_in_flight(o, [3.0, 5.0]) for o in gpipe] == [24.0, 40.0]
    zbv = rank_orders("ZBVZeroBubble", [0, 1, 1, 0], 2, 4)
    assert peak_in_flight(zbv[0], [1.0, 0.0, 0.0, 1.0]) > 0  # W frees, I does not
