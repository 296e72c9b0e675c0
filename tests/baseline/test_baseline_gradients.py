"""A foreign trainer's gradient dump against the PyTorch baseline's (harness.baseline.gradients)
and what the baseline check makes of it (harness.baseline.live.judged), in process, on dumps
written here with numpy in each side's own naming:

- the subject's as InfiniTrain's #209 writes GPT-2's: `transformer.` names, `lm_head.weight`
  as its own file (tied to wte at PP 1), the real vocabulary's rows at TP 1, a TP rank's
  un-gathered shard under the full name;
- the baseline's as the bundled trainer writes them: llm.c names, the tied head once (as
  `wte.weight`), the padded vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.baseline.gradients import GradientRequest, compare_with_baseline
from harness.baseline.live import judged
from harness.contracts.semantics import BaselineUnmatched, baseline_parameter_name
from harness.compare.render import gradient_lines
from harness.contracts.tolerance import Tolerance

V, VP, C = 10, 16, 4  # real and padded vocabulary, width


def _baseline(folder: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """The bundled trainer's dump: llm.c names, padded wte (its padded rows carry nothing), no
    separate lm_head file."""
    rng = np.random.default_rng(seed)
    wte = np.zeros((VP, C), np.float32)
    wte[:V] = rng.normal(size=(V, C))
    grads = {"wte.weight": wte, "wpe.weight": rng.normal(size=(8, C)),
             "h.0.ln_1.weight": rng.normal(size=(C,)),
             "h.0.mlp.c_fc.weight": rng.normal(size=(4 * C, C)),
             "ln_f.bias": rng.normal(size=(C,))}
    folder.mkdir(parents=True)
    for name, value in grads.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))
    return grads


def _subject(folder: Path, grads: dict[str, np.ndarray], tp_rank: int | None = None,
             tp: int = 1) -> None:
    """#209's dump of the same gradients: InfiniTrain's names, lm_head as wte's own file, the
    real vocabulary at TP 1; with `tp_rank`, that rank's shard of c_fc (rows) and of the
    padded vocabulary, un-gathered, under the full name."""
    folder.mkdir(parents=True)
    files = {"transformer." + name: value for name, value in grads.items()}
    wte = grads["wte.weight"]
    if tp_rank is None:
        files["transformer.wte.weight"] = wte[:V]
    else:
        rows = VP // tp
        files["transformer.wte.weight"] = wte[tp_rank * rows:(tp_rank + 1) * rows]
        fc = grads["h.0.mlp.c_fc.weight"]
        part = fc.shape[0] // tp
        files["transformer.h.0.mlp.c_fc.weight"] = fc[tp_rank * part:(tp_rank + 1) * part]
    files["lm_head.weight"] = files["transformer.wte.weight"]
    for name, value in files.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))


def _compare(tmp_path: Path, tp: int = 1):
    request = GradientRequest(tmp_path / "run", tmp_path / "case" / "baseline-gradients",
                              Tolerance(1e-5), 1e-5, tensor_parallel=tp)
    return compare_with_baseline("gpt2", request, tmp_path / "base")


def test_the_same_gradients_in_both_namings_pass_every_parameter(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    diff = _compare(tmp_path)
    assert (diff.missing, diff.extra, diff.shape_errors) == ([], [], [])
    # every baseline parameter, and the tied head under its own name: 6 compared
    assert sorted(d.name for d in diff.diffs) == sorted([*grads, "lm_head.weight"])
    assert diff.ok and diff.max_abs_diff == 0.0
    assert not (tmp_path / "case" / "baseline-gradients").exists()  # the links and copies go


def test_a_kernel_bug_in_one_parameter_fails_naming_it_under_the_bundled_name(tmp_path):
    """Plant: the subject's final-norm bias gradient off by 1e-3 relative (a kernel bug every
    configuration shares, so its own single-device run has it too)."""
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", {**grads, "ln_f.bias": grads["ln_f.bias"] * (1 + 1e-3)})
    diff = _compare(tmp_path)
    assert not diff.ok
    assert [d.name for d in diff.relative_failures] == ["ln_f.bias"]
    assert diff.relative_failures[0].relative_error == pytest.approx(1e-3, rel=1e-3)
    check = judged("pytorch (live)", [{"step": 1, "loss": 5.0}], [1], [5.0], "float32", 1,
                   gradients=diff)
    # the losses agree; the gradients alone fail the check, and say where
    assert check.verdict.ok and check.status == "failed"
    assert check.reason.startswith("gradients: 1 of 6 parameters differ, worst ln_f.bias")
    text = "\n".join(check.lines())
    assert "gradients of the first step against the baseline's" in text
    assert "ln_f.bias" in text
    record = check.record()
    assert record["gradients"]["ok"] is False
    assert record["gradients"]["relative"]["failed"] == ["ln_f.bias"]


def test_a_passing_comparison_keeps_the_check_green_and_recorded(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    check = judged("pytorch (live)", [{"step": 1, "loss": 5.0}], [1], [5.0], "float32", 1,
                   gradients=_compare(tmp_path))
    assert check.status == "passed" and check.reason is None
    assert check.record()["gradients"]["parameters"] == 6
    assert check.record()["gradients_reason"] is None


def test_the_tied_head_differing_from_wte_fails_as_lm_head(tmp_path):
    """InfiniTrain ties lm_head to wte at PP 1 only (transformer.cc:256): an untied head's
    gradient is not the embedding's, and the baseline (tied, as GPT-2 is) says so."""
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    head = tmp_path / "run" / "lm_head.weight.npy"
    np.save(head, np.load(head) * 0.5)
    diff = _compare(tmp_path)
    assert [d.name for d in diff.relative_failures] == ["lm_head.weight"]


def test_a_parameter_the_subject_did_not_dump_is_missing(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    (tmp_path / "run" / "transformer.wpe.weight.npy").unlink()
    diff = _compare(tmp_path)
    assert diff.missing == ["wpe.weight"] and not diff.ok


def test_the_padded_vocabulary_is_cut_at_tp_1_only_and_a_real_row_still_counts(tmp_path):
    grads = _baseline(tmp_path / "base")
    wte = grads["wte.weight"].copy()
    wte[V - 1] += 1.0  # the last real row: inside what is compared
    _subject(tmp_path / "run", {**grads, "wte.weight": wte})
    diff = _compare(tmp_path)
    assert {d.name for d in diff.relative_failures} == {"wte.weight", "lm_head.weight"}
    assert diff.shape_errors == []


def test_a_tp_ranks_shards_are_compared_with_their_slice(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads, tp_rank=1, tp=2)
    diff = _compare(tmp_path, tp=2)
    assert diff.ok, gradient_lines(diff)
    assert diff.tp_slices == 3  # c_fc, wte and lm_head: each rank 1's half


def test_two_run_files_for_one_parameter_and_an_unknown_program_are_refused(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    np.save(tmp_path / "run" / "ln_f.bias.npy", grads["ln_f.bias"])  # and transformer.ln_f.bias
    with pytest.raises(BaselineUnmatched, match="ln_f.bias: two of the run's files"):
        _compare(tmp_path)
    with pytest.raises(BaselineUnmatched, match="no gradient dump naming recorded for "
                                                "InfiniTrain's 'llama3'"):
        baseline_parameter_name("llama3", "transformer.h.0.attn.c_attn.weight")
    assert baseline_parameter_name("gpt2", "transformer.h.3.attn.c_attn.weight") == \
        "h.3.attn.c_attn.weight"
    assert baseline_parameter_name("gpt2", "lm_head.weight") == "lm_head.weight"


def test_a_second_comparison_in_the_same_case_folder_starts_clean(tmp_path):
    grads = _baseline(tmp_path / "base")
    _subject(tmp_path / "run", grads)
    assert _compare(tmp_path).ok
    (tmp_path / "run" / "transformer.ln_f.bias.npy").unlink()
    assert _compare(tmp_path).missing == ["ln_f.bias"]  # no stale link kept it


# --- the live baseline's own path (harness.baseline.live.LiveBaseline), its run faked ---------

class _Subject:
    def baseline_flags(self, model, args):
        return {"model": model, "dtype": "float32", "num_iteration": 2, "optimizer": "sgd"}


def _live(tmp_path, dumps=True):
    """A LiveBaseline whose run writes two steps and, when asked, the baseline's gradients
    (_baseline's); the calls it got."""
    from types import SimpleNamespace

    from harness.baseline.live import LiveBaseline

    calls = []

    def run(backend, name, model, flags, checkpoint, input_bin, folder, gradients):
        calls.append(gradients)
        if gradients and dumps:
            _baseline(folder / "gradients")
        result = SimpleNamespace(argv=["python", "-m", "harness.trainer"], duration_s=0.1,
                                 returncode=0, stderr="log")
        outputs = SimpleNamespace(steps=[{"step": 1, "loss": 5.0, "lr": 1e-4},
                                         {"step": 2, "loss": 4.9, "lr": 1e-4}], problem=None)
        return SimpleNamespace(launched=SimpleNamespace(result=result), outputs=outputs,
                               failed=False)

    settings = SimpleNamespace(reference_root=tmp_path / "refs", device="cpu")
    return LiveBaseline(settings, run), calls


def _files(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"m")
    (tmp_path / "tokens.bin").write_bytes(b"t")
    return tmp_path / "model.bin", tmp_path / "tokens.bin"


RUN_STEPS = [{"step": 1, "loss": 5.0, "lr": 1e-4}, {"step": 2, "loss": 4.9, "lr": 1e-4}]


def test_the_live_baseline_dumps_compares_and_caches_its_gradients(tmp_path):
    model, tokens = _files(tmp_path)
    grads = _baseline(tmp_path / "expected")
    _subject(tmp_path / "run", {**grads, "ln_f.bias": grads["ln_f.bias"] * (1 + 1e-3)})
    live, calls = _live(tmp_path)
    request = GradientRequest(tmp_path / "run", tmp_path / "case" / "bg", Tolerance(1e-5), 1e-5)
    checks = [live.check(_Subject(), "gpt2", "basic/gpt2/1", {}, RUN_STEPS, model, tokens, 1,
                         request) for _ in range(2)]
    assert calls == [True]  # built once, with its gradients; the second check reuses it
    for check in checks:
        assert check.verdict.ok and check.status == "failed"
        assert check.gradients.relative_failures[0].name == "ln_f.bias"
    # a case without gradients has its own entry: the dumping one is not taken for it
    plain = live.check(_Subject(), "gpt2", "basic/gpt2/1", {}, RUN_STEPS, model, tokens, 1,
                       None, "not dumped by this trainer")
    assert calls == [True, False]
    assert plain.status == "passed" and plain.gradients is None
    assert plain.record()["gradients_reason"] == "not dumped by this trainer"


def test_a_program_with_no_dump_naming_is_judged_on_losses_and_says_why(tmp_path):
    model, tokens = _files(tmp_path)
    _subject(tmp_path / "run", _baseline(tmp_path / "expected"))
    live, _ = _live(tmp_path)
    request = GradientRequest(tmp_path / "run", tmp_path / "case" / "bg", Tolerance(1e-5), 1e-5)
    check = live.check(_Subject(), "llama3", "basic/llama3/1", {}, RUN_STEPS, model, tokens, 1,
                       request)
    assert check.status == "passed" and check.gradients is None
    assert "no gradient dump naming recorded for InfiniTrain's 'llama3'" in \
        check.gradients_reason


def test_a_baseline_run_that_dumps_no_gradients_when_asked_is_an_error(tmp_path):
    model, tokens = _files(tmp_path)
    _subject(tmp_path / "run", _baseline(tmp_path / "expected"))
    live, _ = _live(tmp_path, dumps=False)
    request = GradientRequest(tmp_path / "run", tmp_path / "case" / "bg", Tolerance(1e-5), 1e-5)
    check = live.check(_Subject(), "gpt2", "basic/gpt2/1", {}, RUN_STEPS, model, tokens, 1,
                       request)
    assert check.status == "error" and "it dumped no gradients" in check.reason
