"""docs/coverage.md is what `python -m harness.trainer.coverage` generates from the shipped config,
and the schedule matrix covers what the trainer supports at a bounded CI cost. In process: the
cases are planned by the trainer's pure plan function, nothing is launched."""

from __future__ import annotations

import json

import pytest

from harness.trainer.coverage import (
    BEGIN,
    CI_DEVICES,
    DEFAULT_CONFIG,
    DEFAULT_DOC,
    END,
    CoverageError,
    main,
    plan_config,
    render,
    splice,
)
from harness.contracts.flags import SCHEDULES
from harness.trainer.parallel.schedules import SCHEDULES_FOR_KIND


@pytest.fixture(scope="module")
def planned():
    return plan_config(DEFAULT_CONFIG)


def test_doc_is_up_to_date(planned):
    doc = DEFAULT_DOC.read_text()
    assert splice(doc, render(planned)) == doc, (
        "docs/coverage.md is out of date: run python -m harness.trainer.coverage --write")


def test_every_schedule_and_chunk_order_pair_has_a_case(planned):
    pairs = {(p.kind, p.schedule) for p in planned if p.schedule}
    expected = {(kind, s) for kind, names in SCHEDULES_FOR_KIND.items() for s in names}
    assert expected <= pairs
    assert set(SCHEDULES) <= {s for _, s in pairs}


def test_every_schedule_runs_with_pp_dp_tp_on_both_models(planned):
    for schedule in SCHEDULES:
        models = {p.case.model for p in planned
                  if p.schedule == schedule and p.case.pp > 1 and p.case.dp > 1 and p.case.tp > 1}
        assert models == {"gpt2", "llama3"}, schedule
    dtypes = {p.dtype for p in planned if p.case.tag == "schedules"}
    assert dtypes == {"fp32", "bf16"}


def test_schedules_tag_costs_ci_at_most_four_small_cases(planned):
    matrix = [p for p in planned if p.case.tag == "schedules"]
    in_ci = [p for p in matrix if p.case.world_size <= CI_DEVICES]
    assert 1 <= len(in_ci) <= 4
    assert len(matrix) > 4 * len(in_ci)


def test_gpt2_v_shape_with_both_ends_on_one_rank_runs_in_ci(planned):
    """The hole the planted-bug run found: the tied embedding / LM head gradient summed on one
    rank. The V-shape puts chunk 0 (embedding) and the last chunk (LM head) on stage 0."""
    hits = [p for p in planned if p.case.model == "gpt2" and p.kind == "v-shape" and p.in_ci]
    assert hits
    chunks = hits[0].layout.split(",")
    assert chunks[0].split(":")[0] == chunks[-1].split(":")[0] == "0"
    assert hits[0].schedule == "ZBVZeroBubble"


def test_a_case_the_trainer_refuses_is_named(tmp_path):
    config = json.loads(DEFAULT_CONFIG.read_text())
    config.pop("$schema")
    config["test_groups"] = [{"tag": "t", "tests": [{"id": "dualpipev-too-few", "args": {
        "pipeline_parallel": 4, "data_parallel": 2, "pipeline_schedule": "DualPipeV",
        "pipeline_chunk_layout": "0:1,1:1,2:1,3:1,3:1,2:1,1:1,0:1"}}]}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CoverageError, match=r"t/gpt2/dualpipev-too-few: .*DualPipeV needs at "
                                            r"least as many microbatches as chunks \(8\)"):
        plan_config(path)


def test_splice_replaces_only_between_markers():
    doc = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert splice(doc, "new\n") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(CoverageError):
        splice("no markers\n", "new\n")


def test_check_reports_a_stale_doc(tmp_path, capsys):
    doc = tmp_path / "coverage.md"
    doc.write_text(f"# x\n{BEGIN}\nstale\n{END}\n")
    assert main(["--doc", str(doc), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--doc", str(doc), "--write"]) == 0
    assert main(["--doc", str(doc), "--check"]) == 0
    assert doc.read_text().startswith("# x\n")
