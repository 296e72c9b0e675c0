"""harness/logs/pairing.py and cli.pair: descriptive names only through the cited table or a
pairing file, baseline and subject by (model, case, tag), and what has no partner."""

import json
from pathlib import Path

import pytest

from harness.logs.cli import BAD, FAILED, NO_PARTNER, PASSED, pair
from harness.logs.pairing import DESCRIPTIVE, read_pairing, resolve
from harness.logs.readers import BadInput, Reading, RecordedRun, dtype_of, read_paths

FIXTURES = Path(__file__).parent / "fixtures"
LOSSES = (5.356189, 5.060790, 4.860480)


def _run(kind="infinitrain", model="gpt2", case="1", tag=None, dtype=None, losses=LOSSES,
         source=None, section=None):
    meta = {"section": section} if section else {}
    return RecordedRun(kind, model, case, dtype or (dtype_of(case) if case else "float32"),
                       tuple(range(1, len(losses) + 1)), tuple(losses),
                       source or f"{kind}/{model}_{case}.log", tag=tag, meta=meta)


def _reading(*runs):
    return Reading(tuple(runs), ())


def test_every_table_row_cites_its_source_and_keeps_the_dtype():
    assert len(DESCRIPTIVE) == 12 and len({m.section for m in DESCRIPTIVE}) == 12
    for row in DESCRIPTIVE:
        assert "run_pytorch_training.sh@143d981" in row.source and "test_config.json" in row.source
        assert dtype_of(row.section) == dtype_of(row.case), row
    assert {(m.section, m.model, m.case) for m in DESCRIPTIVE} >= {
        ("GPT-2 (Single GPU, default batch, fp32)", "gpt2", "1"),
        ("GPT-2 (Single GPU, default batch, bf16)", "gpt2", "1_bfloat16"),
        ("GPT-2 (Single GPU, total_batch_size 5120, fp32)", "gpt2", "2"),
        ("LLaMA3_2 (8 GPUs, total_batch_size 5120, bf16)", "llama3", "3_bfloat16")}


def test_descriptive_fixture_pairs_through_the_table():
    cases = pair(read_paths([FIXTURES / "pytorch_descriptive"]), read_paths([FIXTURES / "run"]))
    assert [(c.label, c.status) for c in cases] == [("gpt2/1", FAILED), ("llama3/1", PASSED)]
    assert "table: " in cases[0].baseline.meta["paired_by"]


def test_an_unknown_descriptive_section_is_listed_not_dropped():
    odd = _run("pytorch", case=None, section="GPT-2 (Single GPU, fp16)", source="p.log [x]")
    (case,) = pair(_reading(odd), Reading((), ()))
    assert case.status == NO_PARTNER
    assert "no partner: descriptive name, give a pairing" in case.why


def test_a_pairing_file_pairs_a_section(tmp_path):
    odd = _run("pytorch", case=None, section="GPT-2 (Single GPU, fp32, again)", losses=LOSSES)
    path = tmp_path / "pairing.json"
    path.write_text(json.dumps({"GPT-2 (Single GPU, fp32, again)": "gpt2_1"}))
    (case,) = pair(_reading(odd), _reading(_run()), read_pairing(path))
    assert (case.label, case.status) == ("gpt2/1", PASSED)
    assert case.baseline.meta["paired_by"] == "--pairing"


def test_a_pairing_of_another_model_or_dtype_is_a_bad_input():
    odd = _run("pytorch", case=None, section="GPT-2 (Single GPU, fp32, again)")
    for target in (("llama3", "1"), ("gpt2", "1_bfloat16")):
        got = resolve(odd, {"GPT-2 (Single GPU, fp32, again)": target})
        assert isinstance(got, BadInput) and "expected gpt2 float32 as the log says" in got.message


@pytest.mark.parametrize("text, expected", [
    ("[1]", "expected an object"),
    ('{"a": "gpt2"}', "expected \"<model>_<case>\""),
    ("{", "expected a JSON object"),
])
def test_a_bad_pairing_file_names_itself(tmp_path, text, expected):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=expected) as e:
        read_pairing(path)
    assert str(path) in str(e.value)


def test_tags_pair_when_both_sides_have_one():
    basic, other = _run("harness", tag="basic"), _run("harness", tag="other",
                                                     losses=(9.0, 9.0, 9.0))
    base = _reading(_run("pytorch", tag="basic", source="b1"), _run("pytorch", tag="other",
                                                                     source="b2"))
    cases = {c.tag: c for c in pair(base, _reading(basic, other))}
    assert cases["basic"].status == PASSED and cases["basic"].baseline.source == "b1"
    assert cases["other"].status == FAILED and cases["other"].baseline.source == "b2"
    # an untagged baseline serves every tag
    cases = pair(_reading(_run("pytorch")), _reading(basic, other))
    assert sorted(c.status for c in cases) == [FAILED, PASSED]


def test_what_has_no_partner_on_either_side_is_listed():
    cases = pair(_reading(_run("pytorch", case="2")), _reading(_run(case="1")))
    assert {(c.label, c.status, c.baseline is None) for c in cases} == {
        ("gpt2/1", NO_PARTNER, True), ("gpt2/2", NO_PARTNER, False)}


def test_two_logs_for_one_case_are_a_bad_input_and_the_case_stays():
    cases = pair(_reading(_run("pytorch")),
                 _reading(_run(source="a/gpt2_1.log"), _run(source="b/gpt2_1.log")))
    (case,) = cases
    assert case.status == BAD and "two subject logs for gpt2/1" in case.why
    assert "a/gpt2_1.log" in case.why and "b/gpt2_1.log" in case.why


def test_a_baseline_of_another_dtype_is_a_bad_pairing():
    (case,) = pair(_reading(_run("pytorch")), _reading(_run("harness", dtype="bfloat16")))
    assert case.status == BAD
    assert "the baseline is gpt2 float32; expected gpt2 bfloat16" in case.why
    assert "pytorch/gpt2_1.log" in case.why


def test_a_baseline_with_other_steps_is_a_bad_pairing():
    (case,) = pair(_reading(_run("pytorch", losses=LOSSES[:2])), _reading(_run()))
    assert case.status == BAD and "the baseline has steps 1-2, the run 1-3" in case.why


def test_script_sections_pair_with_the_lr_scheduler_logs():
    lrs = FIXTURES / "lr_scheduler"
    cases = pair(read_paths([lrs / "pytorch"]), read_paths([lrs / "infinitrain"]))
    assert len(cases) == 20 and {c.status for c in cases} <= {PASSED, FAILED}
    assert {c.label for c in cases} >= {"lr_scheduler/gpt2/3_none_zero2",
                                        "lr_scheduler/llama3/8_bfloat16_none_all_parallel"}
    assert all(c.lr is not None and c.lr.problem is None for c in cases)


def test_megatron_tiny_mixtral_pairs_with_a_moe_log(tmp_path):
    # no InfiniTrain tiny_mixtral log is in the recorded feat/lr_scheduler run (its tags are
    # basic, build, checkpoint, ctest, lora, lr_scheduler, zero): this one is written in the
    # runner's layout (logs/moe/tiny_mixtral_<id>.log beside a run_metadata.log) from the
    # Megatron log's own step lines, which tiny_mixtral prints in the same format
    megatron = FIXTURES / "lr_scheduler" / "megatron" / "result_megatron_tiny_mixtral.log"
    lines = megatron.read_text().split("Running: tiny_mixtral_1 (float32)")[1].splitlines()
    steps = [line for line in lines if line.startswith("step ")][:10]
    moe = tmp_path / "logs" / "moe"
    moe.mkdir(parents=True)
    (tmp_path / "logs" / "run_metadata.log").write_text("[GIT_BRANCH] feat/support_moe\n")
    (moe / "tiny_mixtral_1.log").write_text("\n".join(steps) + "\n")
    cases = {c.label: c for c in pair(read_paths([megatron]), read_paths([tmp_path]))}
    case = cases["moe/tiny_mixtral/1"]
    assert case.status == PASSED and case.verdict.max_abs_diff == 0.0
    assert case.lr.ok and case.lr.steps == tuple(range(1, 11))
    assert {cases[k].status for k in cases if k != "moe/tiny_mixtral/1"} == {NO_PARTNER}
