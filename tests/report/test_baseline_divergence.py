"""The report's divergence from the baseline, step by step: each step's |run - baseline| as a
share of what the verdict allows there (harness.compare.baseline.step_limit), drawn per model
and linked under the baseline table."""

from __future__ import annotations

import math

from harness.compare.baseline import judge_baseline
from harness.report import document
from harness.report.baseline import divergence, section


def _record(name: str, run: list[float], base: list[float], dtype: str = "float32",
            resolution: float = 1e-6) -> dict:
    verdict = judge_baseline(range(1, len(run) + 1), run, range(1, len(base) + 1), base, dtype,
                             resolution=resolution)
    return {"name": name, "model": name.split("/")[1], "self_check": "passed",
            "trainer": "infinitrain",
            "baseline": {"source": "pytorch (live)", "status": "passed" if verdict.ok else "failed",
                         "first_diverging_step": verdict.first_diverging_step,
                         "loss": verdict.to_dict()}}


def test_a_share_over_one_is_exactly_a_step_the_verdict_counted_as_diverging():
    # A planted bug every configuration shares: the loss drifts from step 3 (1.2e-4 at loss 5,
    # over float32's relative 1e-5 x 5 = 5e-5); steps 1-2 differ by the print resolution only,
    # and step 2 by 4e-5 (under the threshold at loss 5, though over an absolute 1e-5).
    base = [5.0, 5.0, 5.0, 5.0]
    record = _record("basic/gpt2/1", [5.0 + 1e-6, 5.0 + 4e-5, 5.0 + 1.2e-4, 5.0 + 3e-4], base)
    d = divergence(record)
    assert d.steps == (1, 2, 3, 4) and d.first_diverging_step == 3
    over = [s for s, r in zip(d.steps, d.ratios) if r > 1]
    assert over == [3, 4]  # the verdict's diverging steps, no more, no fewer
    assert math.isclose(d.ratios[1], 4e-5 / 5e-5, rel_tol=1e-6)
    # at a coarser print resolution (4 decimals) the same 1.2e-4 is printing, not a bug
    coarse = divergence(_record("basic/gpt2/1", [5.0, 5.0, 5.0 + 1.2e-4, 5.0], base,
                                resolution=1e-4))
    assert coarse.first_diverging_step == 3 and coarse.ratios[2] > 1  # over 1e-4 (1 + 1e-6)
    even = divergence(_record("basic/gpt2/1", [5.0, 5.0, 5.0 + 1e-4, 5.0], base,
                              resolution=1e-4))
    assert even.first_diverging_step is None and max(even.ratios) <= 1


def test_no_judged_loss_no_divergence():
    assert divergence({"name": "a/gpt2/x", "baseline": None}) is None
    bad = _record("a/gpt2/x", [5.0], [5.0, 4.0])  # other steps than the run: a bad pairing
    assert divergence(bad) is None
    old = _record("a/gpt2/x", [5.0], [5.0])
    del old["baseline"]["loss"]["resolution"]  # a record from before the resolution was kept
    assert divergence(old) is None


def test_the_report_draws_one_plot_per_model_and_links_it_under_the_table(tmp_path):
    records = [_record("basic/gpt2/1", [5.0, 5.0 + 3e-4], [5.0, 5.0]),
               _record("basic/gpt2/2", [5.0, 5.0], [5.0, 5.0]),
               _record("basic/llama3/1", [3.0, 3.0 + 1e-6], [3.0, 3.0]),
               {"name": "basic/llama3/2", "model": "llama3", "baseline": None}]
    images: list = []
    links = document._divergence_plots(records, tmp_path / "report.md", images)
    assert links == {"gpt2": "report-baseline-gpt2.png", "llama3": "report-baseline-llama3.png"}
    assert [p.name for p in images] == list(links.values())
    assert all(p.stat().st_size > 1000 for p in images)
    text = "\n".join(section(records, links))
    assert "](report-baseline-gpt2.png)" in text and "](report-baseline-llama3.png)" in text
    assert document._divergence_plots(records[3:], tmp_path / "none.md", []) == {}
