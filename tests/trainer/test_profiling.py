"""The layer profiler counts the loss (computed outside the model) as part of `lm_head`."""

from __future__ import annotations

import time

import torch

from harness.trainer.engine import SingleDeviceEngine, cross_entropy
from harness.trainer.models import GPT2Config, build_model
from harness.trainer.profiling import LayerProfiler

CONFIG = GPT2Config(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8,
                    padded_vocab_size=16)
PAUSE_S = 0.05


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(PAUSE_S)
        return grad


def slow_loss(logits, targets):
    time.sleep(PAUSE_S)
    return cross_entropy(_SlowBackward.apply(logits), targets)


def _lm_head_record(loss_fn=None) -> dict:
    torch.manual_seed(0)
    engine = SingleDeviceEngine(build_model(CONFIG), torch.device("cpu"), torch.float32)
    profiler = LayerProfiler(engine.parts, torch.device("cpu"), rank=0)
    engine.loss_fn = profiler.timed_loss(loss_fn or engine.loss_fn)
    x = torch.randint(0, 16, (2, 1, 8))
    engine.forward_backward(x, torch.roll(x, 1, dims=-1))
    records = {r["layer"]: r for r in profiler.take_records(step=1)}
    assert set(records) == {"embedding", 0, 1, "lm_head"}
    return records["lm_head"]


def test_loss_forward_and_backward_are_timed_as_part_of_lm_head():
    head = _lm_head_record(slow_loss)
    # Two microbatches, each pausing once in the loss's forward and once in its backward.
    assert head["forward_ms"] >= 2 * PAUSE_S * 1e3
    assert head["backward_ms"] >= 2 * PAUSE_S * 1e3


def test_without_a_slow_loss_lm_head_is_timed():
    # How small it stays (under PAUSE_S) is a wall-clock bound: benchmarks/timing_bounds.py.
    head = _lm_head_record()
    assert head["forward_ms"] > 0 and head["backward_ms"] > 0
