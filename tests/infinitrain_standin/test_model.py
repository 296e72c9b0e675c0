"""The stand-in's head against the plain formula: its forward is cached per step (dropped by
Model.apply_update) and its gradient summed factored (model._HeadForward, HeadGradient), and
neither may change the mathematics: per token, softmax(e @ W.T) less the one-hot target, scaled
by scale / n."""

from __future__ import annotations

import numpy as np
import pytest

from tests.infinitrain_standin.model import (
    F32,
    Config,
    HeadGradient,
    Model,
    Numerics,
    RowGradient,
    dense,
)

V, PADDED, C = 37, 40, 6


def _model(tp: int) -> Model:
    cfg = Config(family="llama3", block_size=8, vocab_size=V, n_layer=1, n_head=2, n_embd=C,
                 padded_vocab_size=PADDED)
    rng = np.random.default_rng(0)
    head = rng.standard_normal((PADDED if tp > 1 else V, C)).astype(F32)
    return Model(cfg, {"lm_head.weight": head}, Numerics(tp=tp))


def _microbatch(seed: int, rows: np.ndarray, n: int = 20):
    """Distinct input rows drawn from `rows` (so that microbatches share some), the tokens'
    rows (inv), their targets, and each row's count, as forward_backward passes them."""
    rng = np.random.default_rng(seed)
    e = rows[rng.choice(len(rows), size=5, replace=False)]
    inv = np.concatenate([np.arange(5), rng.integers(0, 5, n - 5)])
    y = rng.integers(0, V, n)
    return e, inv, y, np.bincount(inv, minlength=5)


def _plain(W: np.ndarray, e, inv, y, scale):
    """Loss, d(loss*scale)/de and d(loss*scale)/dW token by token, in float64."""
    W, e = W[:V].astype(np.float64), e.astype(np.float64)
    logits = e[inv] @ W.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    d = p.copy()
    d[np.arange(n), y] -= 1
    d *= scale / n
    de = np.zeros_like(e)
    np.add.at(de, inv, d @ W)
    return loss, de, d.T @ e[inv]


@pytest.mark.parametrize("tp", [1, 2])
def test_the_cached_factored_head_is_the_plain_formula_over_microbatches_and_steps(tp):
    model = _model(tp)
    rows = np.random.default_rng(1).standard_normal((8, C)).astype(F32)
    for step in range(2):
        W = model.P["lm_head.weight"].copy()
        total, expected = None, np.zeros((V, C))
        for k in range(3):  # rows recur across the step's microbatches: the cache is used
            e, inv, y, cnt = _microbatch(10 * step + k, rows)
            grads = {}
            loss, de = model._head(e, inv, y, cnt, 0.5, len(y), grads)
            want_loss, want_de, want_gW = _plain(W, e, inv, y, 0.5)
            assert loss == pytest.approx(want_loss, rel=1e-5)
            np.testing.assert_allclose(de, want_de, rtol=1e-4, atol=1e-6)
            assert isinstance(grads["lm_head.weight"], HeadGradient)
            total = grads if total is None else {"lm_head.weight": total["lm_head.weight"]
                                                 + grads["lm_head.weight"]}
            expected += want_gW
        got = dense(total)["lm_head.weight"]
        assert got.shape == model.P["lm_head.weight"].shape and got.dtype == F32
        np.testing.assert_allclose(got[:V], expected, rtol=1e-4, atol=1e-6)
        assert not got[V:].any()  # the padded rows get no gradient
        # An update: the next step's forward must use the new weights, not the cached ones.
        model.apply_update({"lm_head.weight": got}, F32(0.3))


def test_an_update_outside_apply_update_leaves_the_cached_forward_stale():
    """Why the trainer updates through Model.apply_update: weights changed behind the model's
    back keep the step's old softmax; a change through apply_update is seen."""
    model = _model(1)
    rows = np.random.default_rng(1).standard_normal((8, C)).astype(F32)
    e, inv, y, cnt = _microbatch(0, rows)
    W0 = model.P["lm_head.weight"].copy()
    model._head(e, inv, y, cnt, 1.0, len(y), {})
    model.P["lm_head.weight"] *= F32(2.0)  # behind the model's back
    stale, _ = model._head(e, inv, y, cnt, 1.0, len(y), {})
    model.apply_update({"lm_head.weight": -W0}, F32(1.0))  # 2 W0 + W0
    fresh, _ = model._head(e, inv, y, cnt, 1.0, len(y), {})
    assert stale == pytest.approx(_plain(W0, e, inv, y, 1.0)[0], rel=1e-5)
    assert fresh == pytest.approx(_plain(3 * W0, e, inv, y, 1.0)[0], rel=1e-5)
    assert fresh != pytest.approx(stale, rel=1e-3)


def test_row_gradients_sum_into_their_rows():
    a = RowGradient((4, 2), np.array([0, 2]), np.ones((2, 2), F32))
    b = RowGradient((4, 2), np.array([2, 3]), np.full((2, 2), 2.0, F32))
    out = dense({"wte": a + b, "other": np.zeros(3, F32)})
    np.testing.assert_array_equal(out["wte"], [[1, 1], [0, 0], [3, 3], [2, 2]])
    assert out["other"].shape == (3,)
