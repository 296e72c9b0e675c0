"""What the Hugging Face parity tests of the LLaMA-shaped families share: HF's q / k rows in
the programs' order, and the one comparison (logits, loss, every parameter's gradient)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def interleaved_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Each head's rows from rotate_half's order (first half, second half) to interleaved pairs
    (row 2j is HF's row j, row 2j + 1 HF's row j + hd/2): the inverse of HF's convert-script
    permutation `w.view(n, d1 // n // 2, 2, d2).transpose(1, 2).reshape(d1, d2)`."""
    d1 = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, d1 // n_heads // 2, *rest).transpose(1, 2).reshape(d1, *rest)


def assert_matches_hf(ours, hf, hf_named, idx: torch.Tensor, targets: torch.Tensor,
                      grad_norm: bool = False) -> torch.Tensor:
    """`ours` (a bundled family) against `hf` on one batch: logits, mean cross-entropy, and
    every parameter's gradient under the bundled names (`hf_named(hf, getter)`), optionally the
    gradient norm too. Returns HF's logits (for a test's negative control)."""
    vocab = hf.config.vocab_size
    hf_logits = hf(input_ids=idx).logits
    logits = ours(idx)
    assert logits.shape == (*idx.shape, vocab)
    torch.testing.assert_close(logits, hf_logits, atol=1e-5, rtol=1e-5)
    hf_loss = F.cross_entropy(hf_logits.reshape(-1, vocab), targets.reshape(-1))
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    torch.testing.assert_close(loss, hf_loss, atol=1e-6, rtol=1e-6)
    hf_loss.backward()
    loss.backward()
    expected = hf_named(hf, lambda p: p.grad)
    ours_named = dict(ours.named_parameters())
    assert set(ours_named) == set(expected)
    for name, p in ours_named.items():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-5, rtol=1e-4, msg=name)
    if grad_norm:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ours_named.values()))
        hf_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in expected.values()))
        torch.testing.assert_close(norm, hf_norm, rtol=1e-6, atol=0)
    return hf_logits.detach()
