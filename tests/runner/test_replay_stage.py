"""harness.runner.replay: the replay run in its own process on a subject's traced step, judged,
and what the baseline check and the failure text make of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.baseline.live import BaselineCheck, with_module_check
from harness.contracts.llmc import write_tokens
from harness.contracts.llmc.checkpoint import write_checkpoint
from harness.runner.replay import blame_of, replay_unavailable
from harness.runner.trace import blame_lines
from tests.trainer.test_replay import GPT2, _model, _plant_norm_backward, _trace

FLAGS = {"dtype": "float32", "batch_size": 2, "sequence_length": GPT2.block_size,
         "total_batch_size": 2 * 2 * GPT2.block_size}


def _files(tmp_path: Path, stream) -> tuple[Path, Path]:
    """The model file and a token file of `stream` (StepBatches reads B * T + 1 tokens a
    microbatch, the next starting B * T later: _contiguous_batches' cut)."""
    from harness.assets.generate import init_weights
    checkpoint = write_checkpoint(tmp_path / "gpt2.bin", GPT2, init_weights(GPT2, seed=0))
    flat = [int(t) for t in stream]
    tokens = write_tokens(tmp_path / "tokens.bin", np.asarray(flat, dtype=np.int32), "gpt2")
    return checkpoint, tokens


def _contiguous_batches():
    """Two microbatches of one token stream (what a token file gives the replay), and the
    stream."""
    import torch
    g = torch.Generator().manual_seed(5)
    stream = torch.randint(0, GPT2.vocab_size, (2 * 2 * GPT2.block_size + 1,), generator=g)
    span = 2 * GPT2.block_size
    return [(stream[k * span:(k + 1) * span].reshape(2, -1),
             stream[k * span + 1:(k + 1) * span + 1].reshape(2, -1)) for k in range(2)], stream


@pytest.mark.parametrize("planted", [False, True])
def test_the_replay_process_blames_a_planted_norm_backward_and_nothing_on_a_clean_one(
        tmp_path, planted):
    batches, stream = _contiguous_batches()
    checkpoint, tokens = _files(tmp_path, stream)
    subject = _model(GPT2)
    if planted:
        _plant_norm_backward(subject, "h.1.ln_2", 1.001)
    root, _, _ = _trace(subject, batches, tmp_path / "subject")
    blame = blame_of(root.parent, tmp_path / "replay", None, FLAGS, checkpoint, tokens, 300)
    assert blame["rows"] > 40 and blame["thresholds"]["factor"] == 16.0, blame
    if not planted:
        assert blame["status"] == "clean" and blame["blamed"] is None, blame["line"]
        return
    assert blame["status"] == "blamed", blame
    assert blame["blamed"]["consumers"] == ["h.1.ln_2"] and blame["blamed"]["phase"] == "backward"
    assert "written by h.1.ln_2's backward" in blame["line"]
    # what the baseline check and the failure text make of it
    check = with_module_check(BaselineCheck("pytorch (live)", "passed"),
                              {"status": "matched", "step": 1, "line": "every module matched",
                               "blame": blame})
    assert check.status == "failed" and "module replay at step 1: blamed:" in check.reason
    assert any("on the subject's own inputs: blamed:" in line for line in check.lines())
    assert blame_lines({"blame": blame})[0].startswith("module replay (each module on the "
                                                       "subject's own inputs): blamed: the "
                                                       "gradient of h.1.attn's output")


def test_a_clean_replay_leaves_a_passing_check_passing():
    check = with_module_check(BaselineCheck("pytorch (live)", "passed"),
                              {"status": "matched", "step": 1, "line": "x",
                               "blame": {"status": "clean", "line": "no module over its floor"}})
    assert check.status == "passed"


def test_what_is_not_replayed_is_said():
    assert "multi-rank subject" in replay_unavailable(4, 1, "float32")
    assert "step 3" in replay_unavailable(1, 3, "float32")
    assert "no measured floors for bfloat16" in replay_unavailable(1, 1, "bfloat16")
    assert replay_unavailable(1, 1, "float32") is None


def test_a_replay_that_fails_is_an_error_naming_its_log(tmp_path):
    blame = blame_of(tmp_path / "no-trace", tmp_path / "replay", None, FLAGS,
                     tmp_path / "missing.bin", tmp_path / "missing-tokens.bin", 120)
    assert blame["status"] == "error" and "the replay exit code" in blame["reason"]
    assert "replay.stderr" in blame["reason"]
