"""Comparison mode: the failing night against the passing one."""

from __future__ import annotations

from harness.report import build, read_session
from harness.report.case_view import view
from harness.report.session_diff import compare

from .markdown import row
from .records import failing_session, passing_session


def test_newly_failing_passing_added_and_speed_ratios():
    old = [view(r) for r in passing_session()]
    new = [view(r) for r in failing_session()]
    result = compare(old, new, "old", "new")
    assert [n.name for _, n in result.newly_failing] == ["pipeline_layout/gpt2/pp2-costs-L4.5"]
    assert result.newly_passing == [] and result.removed == []
    assert sorted(c.name for c in result.added) == ["basic/gpt2/pp4-dp4", "basic/llama3/tp2"]
    assert [(n.case_id, round(r, 3)) for _, n, r in result.slower] == [("pp2-costs-L4.5", 0.8)]
    assert [(n.case_id, round(r, 3)) for _, n, r in result.faster] == [("pp2", 1.2)]
    back = compare(new, old, "new", "old")
    assert [n.name for _, n in back.newly_passing] == ["pipeline_layout/gpt2/pp2-costs-L4.5"]


def test_the_comparison_section(passing, failing, tmp_path):
    report = build(read_session([failing]), tmp_path / "r.md", read_session([passing]),
                   with_plots=False)
    text = report.markdown.split("## Against session 20260101-010000-1")[1].split("\n## ")[0]
    assert "- newly failing: **1**; newly passing: **0**" in text
    assert "| `pipeline_layout/gpt2/pp2-costs-L4.5` | ✅ passed | ❌ failed |" in text
    speed = text.split("### Throughput changes")[1]
    assert row(speed, "`pipeline_layout/gpt2/pp2-costs-L4.5`")[1:] == [
        "1,188", "950", "0.800", "-20.0%", "±1.6%", "slower"]
    assert row(speed, "`basic/gpt2/pp2`")[1:] == ["1,000", "1,200", "1.200", "+20.0%", "±1.6%",
                                                  "faster"]
    assert "| noise band | verdict |" in speed.replace("  ", "").replace("| |", "||")
