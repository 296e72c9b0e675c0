"""Parallel setup checks that need no torchrun: validation, schedule choice, mesh rank order."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from harness.layout import PipelineLayout
from harness.trainer.flags import FlagError, TrainerFlags
from harness.trainer.models.configs import GPT2Config, LLaMA3Config
from harness.trainer.parallel.schedules import ScheduleError, chunk_order_kind, gpipe_actions, select_schedule
from harness.trainer.parallel.validate import ParallelSetupError, plan_parallel
from harness.trainer.parallel.world import mesh_coordinates, mesh_rank

GPT2 = GPT2Config(block_size=64, vocab_size=256, n_layer=8, n_head=4, n_embd=32, padded_vocab_size=320)
LLAMA = LLaMA3Config(block_size=64, vocab_size=256, n_layer=8, n_head=4, n_kv_head=2, n_embd=32,
                     ffn_dim_multiplier=1.0, multiple_of=32)
FLAGS = TrainerFlags(batch_size=2, sequence_length=16, total_batch_size=2 * 16 * 8)


def flags(**kw) -> TrainerFlags:
    return replace(FLAGS, **kw)


def test_rank_order_is_tp_fastest_then_dp_then_pp():
    pp, dp, tp = 2, 3, 2
    ranks = [mesh_rank(p, d, t, dp, tp) for p, d, t in itertools.product(range(pp), range(dp), range(tp))]
    assert ranks == list(range(pp * dp * tp))
    for r in range(12):
        assert mesh_rank(*mesh_coordinates(r, dp, tp), dp, tp) == r


def test_world_not_divisible_by_tp_times_pp():
    with pytest.raises(FlagError, match=r"world size 6 is not divisible by --tensor_parallel \* --pipeline_parallel = 2 \* 2 = 4"):
        plan_parallel(flags(tensor_parallel=2, pipeline_parallel=2), GPT2, PipelineLayout.uniform(8, 2), 6)


def test_data_parallel_size_and_batch_arithmetic():
    assert plan_parallel(flags(), GPT2, PipelineLayout.uniform(8, 1), 4).dp == 4
    with pytest.raises(FlagError, match="not a multiple of"):
        plan_parallel(flags(total_batch_size=2 * 16 * 6), GPT2, PipelineLayout.uniform(8, 1), 4)


def test_heads_and_kv_heads_must_divide_tp():
    with pytest.raises(ParallelSetupError, match="n_head=4 is not divisible by --tensor_parallel=8"):
        plan_parallel(flags(tensor_parallel=8), GPT2, PipelineLayout.uniform(8, 1), 8)
    with pytest.raises(ParallelSetupError, match="n_kv_head=2 is not divisible by --tensor_parallel=4"):
        plan_parallel(flags(tensor_parallel=4), LLAMA, PipelineLayout.uniform(8, 1), 4)
    assert plan_parallel(flags(tensor_parallel=2), LLAMA, PipelineLayout.uniform(8, 1), 2).dp == 1


def test_layout_must_match_pipeline_and_model():
    with pytest.raises(ParallelSetupError, match="the layout has 4 stages but --pipeline_parallel is 2"):
        plan_parallel(flags(pipeline_parallel=2), GPT2, PipelineLayout.uniform(8, 4), 2)
    with pytest.raises(ParallelSetupError, match="places 6 layers but the model has 8"):
        plan_parallel(flags(pipeline_parallel=2), GPT2, PipelineLayout.uniform(6, 2), 2)


@pytest.mark.parametrize(
    "stages, kind",
    [
        ([0, 1, 2, 3], "sequential"),
        ([0, 1, 0, 1], "round-robin"),
        ([0, 1, 2, 0, 1, 2, 0, 1, 2], "round-robin"),
        ([0, 1, 1, 0], "v-shape"),
        ([0, 1, 2, 2, 1, 0], "v-shape"),
        ([0, 0, 1, 1], "custom"),
        ([1, 0], "custom"),
        ([0, 1, 1, 0, 0, 1], "custom"),
    ],
)
def test_chunk_order_kind(stages, kind):
    assert chunk_order_kind(stages, max(stages) + 1) == kind


def test_default_schedule_fits_each_kind():
    assert select_schedule([0, 1], 2, None, 4) == ("sequential", "1F1B")
    assert select_schedule([0, 1, 0, 1], 2, None, 4) == ("round-robin", "Interleaved1F1B")
    assert select_schedule([0, 1, 1, 0], 2, None, 4) == ("v-shape", "ZBVZeroBubble")
    assert select_schedule([0, 0, 1, 1], 2, None, 4) == ("custom", "GPipe")
    assert select_schedule([0, 1, 1, 0], 2, "dualpipev", 4) == ("v-shape", "DualPipeV")


def test_schedule_that_does_not_fit_is_refused_naming_what_fits():
    layout = PipelineLayout.from_chunk_layout(8, 2, "0:2,1:2,1:2,0:2")
    with pytest.raises(ParallelSetupError) as error:
        plan_parallel(flags(pipeline_parallel=2, pipeline_schedule="Interleaved1F1B"), GPT2, layout, 2)
    message = str(error.value)
    assert "--pipeline_schedule=Interleaved1F1B cannot run this layout" in message
    assert "it fits: ZBVZeroBubble, DualPipeV, GPipe" in message
    assert "round-robin chunks" in message  # and names the other layouts' schedules
    with pytest.raises(ParallelSetupError, match="it fits: 1F1B, GPipe"):
        plan_parallel(flags(pipeline_parallel=2, pipeline_schedule="ZBVZeroBubble"), GPT2,
                          PipelineLayout.uniform(8, 2), 2)


def test_microbatch_rules_of_torch_schedules():
    with pytest.raises(ScheduleError, match="1F1B needs at least --pipeline_parallel = 4 microbatches"):
        select_schedule([0, 1, 2, 3], 4, "1F1B", 2)
    assert select_schedule([0, 1, 2, 3], 4, "GPipe", 2)[1] == "GPipe"
    with pytest.raises(ScheduleError, match="DualPipeV needs at least as many microbatches as chunks"):
        select_schedule([0, 1, 1, 0], 2, "DualPipeV", 3)
    with pytest.raises(ScheduleError, match="multiple of max"):
        select_schedule([0, 1, 0, 1], 2, "Interleaved1F1B", 5)
    # through the plan: 2 microbatches per DP rank with dp=2, pp=4 -> 1F1B refused
    layout = PipelineLayout.uniform(8, 4)
    with pytest.raises(ParallelSetupError, match="each pipeline runs 2 microbatches"):
        plan_parallel(flags(pipeline_parallel=4, total_batch_size=2 * 16 * 4), GPT2, layout, 8)


def test_sequence_parallel_needs_divisible_sequence():
    with pytest.raises(ParallelSetupError, match="--sequence_length=15"):
        plan_parallel(flags(tensor_parallel=2, sequence_parallel=True, sequence_length=15,
                                total_batch_size=2 * 15), GPT2, PipelineLayout.uniform(8, 1), 2)


def _random_orders(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        pp = rng.randint(2, 4)
        vpp = rng.randint(1, 3)
        stages = [s for s in range(pp) for _ in range(vpp)]
        rng.shuffle(stages)
        yield pp, stages, rng.randint(1, 6)


@pytest.mark.parametrize("pp, stages, microbatches", list(_random_orders(3, 25)))
def test_gpipe_action_list_runs_any_chunk_order(pp, stages, microbatches):
    """The explicit action list for custom orders is valid and lowers to sends/recvs without a
    deadlock in torch's own lowering and simulator."""
    from torch.distributed.pipelining.schedules import (
        _add_send_recv,
        _simulate_comms_compute,
        _validate_schedule,
    )

    actions = gpipe_actions(stages, pp, microbatches)
    mapping = _validate_schedule(actions, pp, len(stages), microbatches)
    assert mapping == dict(enumerate(stages))
    with_comms = _add_send_recv(
        {r: list(a) for r, a in actions.items()}, stage_to_rank=lambda s: stages[s], num_stages=len(stages)
    )
    _simulate_comms_compute(with_comms, stage_to_rank=lambda s: stages[s], num_stages=len(stages))
