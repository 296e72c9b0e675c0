"""A trainer that cannot give gradients (InfiniTrain's LLaMA 3, TP shards, resumed runs): the
report says so with the reason, never a gradient number or margin."""

from harness.report.markdown import diff_cell, margin_cell

REASON = "not dumped by this trainer (its llama3 binary has no --dump_gradients)"


def test_gradients_not_compared_show_the_reason():
    record = {"status": "passed", "compare": {"loss": True, "gradients": True},
              "gradients": {"compared": False, "reason": REASON},
              "loss": {"max_abs_diff": 0.0, "ok": True, "tolerance": {"atol": 1e-5, "rtol": 0}}}
    assert diff_cell(record, "gradients") == f"not compared: {REASON}"
    assert margin_cell(record, "gradients") == "–"
    assert diff_cell(record, "loss").startswith("0 (atol 1e-05, rtol 0)")


def test_a_foreign_trainers_schedule_is_its_own_not_auto():
    from harness.report.case_view import view

    record = {"name": "basic/gpt2/6", "status": "passed", "parallel": {"pp": 8}, "flags": {},
              "layout": {}}
    assert view({**record, "trainer": "infinitrain"}).schedule == "its own"
    assert view({**record, "trainer": "harness"}).schedule == "auto"
