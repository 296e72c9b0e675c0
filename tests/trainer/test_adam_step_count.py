"""The bundled trainer's Adam counts steps as InfiniTrain's does: one count for every
parameter, advanced each step, a parameter without a gradient skipped (a MoE expert no token
chose: feat/support_moe@b7e0760:infini_train/src/optimizer.cc:53-62). torch.optim's own count
is per parameter, so an expert first chosen at step 2 would be bias-corrected as at step 1."""

from __future__ import annotations

import math

import torch

from harness.trainer.main import _one_adam_step_count

LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def _infinitrain_adam(grads_per_step: list[float | None]) -> float:
    """One scalar parameter from 0 under InfiniTrain's Adam (accumulate_grad.cc's update)."""
    p = m = v = 0.0
    for t, g in enumerate(grads_per_step, start=1):
        if g is None:
            continue
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        p -= LR * (m / (1 - B1 ** t)) / (math.sqrt(v / (1 - B2 ** t)) + EPS)
    return p


def _ours(grads_per_step: list[float | None], aligned: bool) -> float:
    expert = torch.zeros(1, requires_grad=True)
    other = torch.zeros(1, requires_grad=True)  # always has a gradient, as the attention does
    optimizer = torch.optim.AdamW([expert, other], lr=LR, betas=(B1, B2), eps=EPS,
                                  weight_decay=0.0)
    for step, g in enumerate(grads_per_step, start=1):
        optimizer.zero_grad(set_to_none=True)
        other.grad = torch.ones(1)
        if g is not None:
            expert.grad = torch.full((1,), g)
        if aligned:
            _one_adam_step_count(optimizer, step)
        optimizer.step()
    return float(expert.detach())


def test_an_expert_first_chosen_at_step_2_is_bias_corrected_at_step_2():
    grads = [None, 0.5, -0.25, None, 1.0]
    want = _infinitrain_adam(grads)
    assert abs(_ours(grads, aligned=True) - want) < 1e-7
    # torch's own per-parameter count (the planted bug this guards): visibly another value
    assert abs(_ours(grads, aligned=False) - want) > 1e-3


def test_every_step_with_a_gradient_is_torchs_own_adam():
    grads = [0.5, -0.25, 1.0]
    assert abs(_ours(grads, aligned=True) - _ours(grads, aligned=False)) < 1e-9
    assert abs(_ours(grads, aligned=True) - _infinitrain_adam(grads)) < 1e-7
