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


def _block(**changed) -> dict:
    """A header's settings block (Settings.record's names) with the given changes."""
    block = {"slots": 8, "device": "cpu", "launcher": "zygote", "timeout_s": 900.0,
             "config": None, "trainer": None, "workers": None, "marker": None, "keyword": None}
    return {**block, **changed}


def test_compare_reads_the_settings_blocks_of_two_headers():
    from harness.report.session_diff import settings_differences

    old = {"args": ["--gpus", "8"], "settings": _block(workers=2, marker="basic")}
    new = {"args": ["--gpus", "8"], "settings": _block(slots=2, workers=2)}
    assert settings_differences(old, new, [], []) == [("--gpus", "8", "2"),
                                                      ("-m", "basic", "not given")]
    # the blocks win over the arguments: the same arguments, resolved differently
    assert settings_differences({**old, "settings": _block()},
                                {**old, "settings": _block(device="cuda")}, [], []) == [
        ("--harness-device", "cpu", "cuda")]


def test_a_header_differing_only_in_launcher_is_reported_as_such():
    """Planted: the same command line, but one session's auto launcher resolved to torchrun."""
    from harness.report.session_diff import settings_differences

    args = ["--harness-config", "c.json", "-n", "2"]
    old = {"args": args, "settings": _block(launcher="zygote", config="c.json", workers=2)}
    new = {"args": args, "settings": _block(launcher="torchrun", config="c.json", workers=2)}
    assert settings_differences(old, new, [], []) == [
        ("--harness-launcher", "zygote", "torchrun")]


def test_headers_without_a_settings_block_are_compared_by_their_arguments():
    """Headers written before the block (last week's session) still list setting differences,
    by the same names; against a new header both sides are read from their arguments."""
    from harness.report.session_diff import (
        COMPARED_SETTINGS,
        header_settings,
        settings_differences,
        settings_from_args,
    )

    old = {"args": ["--gpus", "8", "--harness-launcher=torchrun", "-k", "pp2"]}
    new = {"args": ["--gpus=2", "-n", "2", "-k", "pp2"]}
    assert header_settings(old) is None
    assert set(settings_from_args(old["args"])) == set(COMPARED_SETTINGS)
    assert settings_differences(old, new, [], []) == [
        ("--gpus", "8", "2"), ("-n", "not given", "2"),
        ("--harness-launcher", "torchrun", "not given")]
    mixed = {**new, "settings": _block(slots=2, workers=2, keyword="pp2")}
    assert settings_differences(old, mixed, [], []) == settings_differences(old, new, [], [])
