"""The baseline check end to end, through sessions of InfiniTrain's own config on the stand-in
(tests/infinitrain_standin): the two verdicts kept apart, each catching its own kind of bug.

- A kernel-level plant that every configuration shares (the final norm's epsilon,
  STANDIN_NORM_EPS): the self-check passes every case, the baseline check (a clean build's
  session, recorded) fails every one.
- A parallelism plant (STANDIN_PLANT scales one parameter's gradient in multi-rank runs): the
  self-check fails the parallel case, the baseline check (losses) passes it.
- The live PyTorch baseline: the stand-in's model is a toy, not GPT-2 (its whole forward is an
  "implementation bug" every configuration shares): self-check green, baseline red, and a LoRA
  case's baseline skipped with the reason; a warm session runs no PyTorch run again.
"""

from __future__ import annotations


import pytest

from tests.infinitrain.test_infinitrain_config import run_session
from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model_files import micro_model_vars

CASES = ("basic/gpt2/1", "basic/gpt2/3")  # one device; 8 ranks (DP 8)
SELECT = ["-k", "basic and not bfloat16 and not lora and (gpt2/1 or gpt2/3)"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    return root, make_build_dir(root / "build"), micro_model_vars(root)


def _by_name(records: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in records if r["name"] in CASES}


@pytest.fixture(scope="module")
def clean_session(standin):
    """A clean build's session: the recorded baseline of the plant sessions."""
    root, build, var_args = standin
    out = root / "clean"
    result, records = run_session(root, build, var_args, out, *SELECT)
    got = _by_name(records)
    assert set(got) == set(CASES), result.stdout[-2000:]
    assert all(r["status"] == "passed" for r in got.values()), result.stdout[-3000:]
    assert "baseline: none checked" in result.stdout  # a bare session says so
    return next(out.glob("sessions/*"))


def test_a_kernel_bug_every_configuration_shares_is_caught_by_the_baseline_only(
        standin, clean_session):
    root, build, var_args = standin
    result, records = run_session(root, build, var_args, root / "eps", *SELECT,
                                  "--harness-baseline", str(clean_session),
                                  env={"STANDIN_NORM_EPS": "1e-2"})
    got = _by_name(records)
    assert set(got) == set(CASES), result.stdout[-2000:]
    for name, record in got.items():
        assert record["self_check"] == "passed", (name, record["reason"])
        assert record["baseline"]["status"] == "failed", (name, record["baseline"])
        assert record["baseline"]["first_diverging_step"] == 1, record["baseline"]
        assert record["status"] == "failed"
        # the reason names the verdict that failed, not the self-check that passed
        assert record["reason"].startswith(f"{name}: the run differs from the "), record
        assert "single-device reference" not in record["reason"].splitlines()[0], record
        assert "baseline" in record["reason"].splitlines()[0], record
    assert "self-check (against its own single-device run): passed" in result.stdout
    assert "baseline (" in result.stdout and "first diverging step 1" in result.stdout


def test_a_parallelism_bug_is_caught_by_the_self_check_only(standin, clean_session):
    root, build, var_args = standin
    result, records = run_session(root, build, var_args, root / "par", *SELECT,
                                  "--harness-baseline", str(clean_session),
                                  env={"STANDIN_PLANT": "transformer.h.5.mlp.c_fc.weight:1e-3"})
    got = _by_name(records)
    assert set(got) == set(CASES), result.stdout[-2000:]
    parallel, single = got["basic/gpt2/3"], got["basic/gpt2/1"]
    assert parallel["self_check"] == "failed", parallel["reason"]
    assert parallel["baseline"]["status"] == "passed", parallel["baseline"]
    assert single["self_check"] == "passed" and single["baseline"]["status"] == "passed"


def test_the_live_pytorch_baseline_is_kept_apart_cached_and_skips_what_it_cannot_match(standin):
    root, build, var_args = standin
    out = root / "live"
    select = ["-k", "not bfloat16 and (basic and gpt2/1 or gpt2/1_lora)"]
    sessions = [run_session(root, build, var_args, out, *select, "--harness-baseline", "pytorch")
                for _ in range(2)]
    for number, (result, records) in enumerate(sessions):
        got = {r["name"]: r for r in records}
        case, lora = got["basic/gpt2/1"], got["lora/gpt2/1_lora"]
        assert case["self_check"] == "passed", case["reason"]
        assert case["baseline"]["status"] == "failed", case["baseline"]
        assert case["baseline"]["source"] == "pytorch (live)"
        assert case["baseline"]["run"]["flags"]["optimizer"] == "sgd"
        assert case["baseline"]["run"]["flags"]["total_batch_size"] == 256  # the listing's
        assert case["baseline"]["run"]["built"] is (number == 0)  # cached: the warm session runs none
        # #209's GPT-2 dumps gradients: the baseline's first step is compared with them,
        # every parameter paired under the bundled trainer's names (the stand-in's toy model
        # differs in every one), the baseline run's dump cached with it
        grads = case["baseline"]["gradients"]
        assert grads["parameters"] == case["gradients"]["parameters"] > 0, grads
        assert (grads["missing"], grads["extra"], grads["shape_errors"]) == ([], [], [])
        assert grads["ok"] is False and "gradients of the first step" in result.stdout
        assert case["baseline"]["gradients_reason"] is None
        assert lora["baseline"]["status"] == "skipped"
        assert "no LoRA" in lora["baseline"]["reason"]
        assert "baseline (pytorch (live)): 1 failed, 1 skipped" in result.stdout
    assert sessions[0][1][0]["baseline"]["losses"] == sessions[1][1][0]["baseline"]["losses"]
