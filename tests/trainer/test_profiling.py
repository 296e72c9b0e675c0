"""The layer profiler counts the loss (computed outside the model) as part of `lm_head`, and
records the memory figures the layout search models: per-layer saved-for-backward and parameter
bytes, and per step the stage's measured peak."""

from __future__ import annotations

import time

import torch

from harness.trainer.engine import SingleDeviceEngine, cross_entropy
from harness.trainer.models import GPT2Config, build_model
from harness.layout.profile import MEMORY_FORMAT, RECORD_FORMAT
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
    records = {r["layer"]: r for r in profiler.take_records(step=1) if r["format"] == RECORD_FORMAT}
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


def _step(profiler, engine, optimizer=None, microbatches=2):
    x = torch.randint(0, 16, (microbatches, 1, 8))
    engine.forward_backward(x, torch.roll(x, 1, dims=-1))
    if optimizer is not None:
        optimizer.step()
    return profiler.take_records(step=1)


def test_memory_figures_per_layer_and_per_stage():
    torch.manual_seed(0)
    engine = SingleDeviceEngine(build_model(CONFIG), torch.device("cpu"), torch.float32)
    optimizer = torch.optim.AdamW([p for part in engine.parts for p in part.parameters()])
    profiler = LayerProfiler(engine.parts, torch.device("cpu"), rank=0, optimizer=optimizer)
    engine.loss_fn = profiler.timed_loss(engine.loss_fn)
    records = _step(profiler, engine, optimizer)
    layers = {r["layer"]: r for r in records if r["format"] == RECORD_FORMAT}
    stage, = [r for r in records if r["format"] == MEMORY_FORMAT]
    block = layers[0]
    assert block["microbatches"] == 2 and block["chunks"] == 1 and block["chunk"] == 0
    # A block keeps its inputs and intermediates, tokens x width floats several times over.
    assert block["activation_bytes"] >= 4 * 8 * CONFIG.n_embd
    assert block["parameter_bytes"] == sum(p.numel() * 4 for p in engine.parts[0].h["0"].parameters())
    # The tied head on one part counts wte: a last stage of its own holds that copy.
    assert layers["lm_head"]["parameter_bytes"] >= CONFIG.padded_vocab_size * CONFIG.n_embd * 4
    parameters = sum(p.numel() * 4 for p in engine.parts[0].parameters())
    assert stage["parameter_bytes"] == stage["gradient_bytes"] == parameters
    assert stage["optimizer_bytes"] >= 2 * parameters  # exp_avg and exp_avg_sq
    # One microbatch at a time on one device: the peak is about one microbatch's activations,
    # and nothing is held after the backward.
    one = sum(r["activation_bytes"] for r in layers.values())
    assert one * 0.9 <= stage["peak_activation_bytes"] <= one * 1.5
    assert stage["held_activation_bytes"] == 0


def test_saved_tensors_are_released_step_after_step():
    torch.manual_seed(0)
    engine = SingleDeviceEngine(build_model(CONFIG), torch.device("cpu"), torch.float32)
    profiler = LayerProfiler(engine.parts, torch.device("cpu"), rank=0)
    engine.loss_fn = profiler.timed_loss(engine.loss_fn)
    peaks = [[r for r in _step(profiler, engine) if r["format"] == MEMORY_FORMAT][0]["peak_activation_bytes"]
             for _ in range(3)]
    assert peaks[0] > 0 and peaks == [peaks[0]] * 3
    assert profiler.meter.live == 0


def test_records_name_the_schedule_they_were_timed_under():
    # The suggestion tool refuses a zero-bubble profile's times (its weight passes are unseen).
    engine = SingleDeviceEngine(build_model(CONFIG), torch.device("cpu"), torch.float32)
    for schedule in (None, "ZBVZeroBubble"):
        profiler = LayerProfiler(engine.parts, torch.device("cpu"), rank=0, schedule=schedule)
        x = torch.randint(0, 16, (2, 1, 8))
        engine.forward_backward(x, torch.roll(x, 1, dims=-1))
        layers = [r for r in profiler.take_records(step=1) if r["format"] == RECORD_FORMAT]
        profiler.close()
        assert len(layers) == 4 and {r["schedule"] for r in layers} == {schedule}
