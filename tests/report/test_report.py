"""The whole report of a failing session: header, counts, case cells, the diagnosis, layout
throughput, plots on disk; and the completeness section of a partial session."""

from __future__ import annotations

import json

from harness.report import build, read_session

from .markdown import row as _row
from .records import passing_session, write


def test_header_says_when_and_on_what(failing_report):
    text = failing_report.markdown
    assert text.startswith("# Harness report: session 20260102-010000-2\n")
    assert "- **torch**: 2.13.0+cu128 (CUDA 12.8)" in text
    assert "- **device**: cuda: NVIDIA H100" in text
    assert "- **git commit**: not recorded" in text  # no session.json header yet


def test_summary_counts_per_tag_and_model(failing_report):
    text = failing_report.markdown
    assert "8 cases recorded: **1 failed, 1 errored**." in text
    assert _row(text, "basic", "gpt2")[:7] == ["basic", "gpt2", "2", "0", "1", "0", "3"]
    assert _row(text, "**all**")[2:] == ["**5**", "**1**", "**1**", "**1**", "**8**"]


def test_case_table_cells(failing_report):
    text = failing_report.markdown.split("## Cases")[1].split("\n## ")[0]
    failed = _row(text, "`pipeline_layout/gpt2/pp2-costs-L4.5`")
    # case, layout, DP, TP, PP, VPP, schedule, dtype, loss, grad, margins, tok/s, MB, wall, status
    assert failed[1:8] == ["6,2", "1", "1", "2", "1", "auto", "float32"]
    assert failed[8] == "0.0042 (atol 1e-05, rtol 0) ✗ 2/4 steps"
    assert failed[9] == "0.03 (atol 1e-05, rtol 0) ✗ 2/100 params"
    assert failed[10:12] == ["–", "–"]  # records without the scale-free verdict
    assert failed[12:] == ["950", "2,048", "30.5", "❌ failed"]
    passed = _row(text, "`basic/gpt2/pp2`")
    assert passed[8:10] == ["1e-07 (atol 1e-05, rtol 0)", "3e-08 (atol 1e-05, rtol 0)"]
    assert passed[-1] == "✅ passed"
    assert "loss max \\|Δ\\| (atol, rtol)" in text and "peak MB " in text  # CUDA records
    assert "process RSS" not in text
    assert "/ tol" not in text
    assert "grad margin: threshold / max ‖Δ‖/‖ref‖" in text


def test_margin_cells_and_disk_kept():
    from harness.results.reading import Session
    from harness.report.markdown import disk_kept, margin_cell

    record = {"loss": {"relative": {"threshold": 1e-6, "worst": 2e-7, "worst_step": 3,
                                    "margin": 5.0, "ok": True}},
              "gradients": {"relative": {"threshold": 1e-5, "worst": 1e-4,
                                         "worst_parameter": "h.6.mlp.c_fc.weight",
                                         "margin": 0.1, "ok": False}},
              "disk_bytes": 3_000_000,
              "dumps": {"policy": "failed", "kept": True, "bytes": 2_000_000,
                        "removed_bytes": 0}}
    assert margin_cell(record, "loss") == "5× (2e-07 vs 1e-06 at step 3)"
    assert margin_cell(record, "gradients") == "✗ 0.1× (0.0001 vs 1e-05 at h.6.mlp.c_fc.weight)"
    exact = {"gradients": {"relative": {"threshold": 1e-5, "worst": 0.0, "margin": "inf"}}}
    assert margin_cell(exact, "gradients").startswith("∞×")
    passed = {"disk_bytes": 1_000_000, "dumps": {"policy": "failed", "kept": False,
                                                 "bytes": 5_000_000, "removed_bytes": 5_000_000}}
    assert disk_kept(Session(paths=[], records=[{"disk_bytes": 4082}])).startswith("4.1 kB in 1")
    session = Session(paths=[], records=[record, passed])
    assert disk_kept(session) == ("4.0 MB in 2 case folder(s) (1 gradient dump(s) kept; 5.0 MB "
                                  "of dumps removed after the diff; keep-dumps failed)")


def test_failure_diagnosis_and_logs(failing_report):
    text = failing_report.markdown
    section = text.split("### `pipeline_layout/gpt2/pp2-costs-L4.5`: failed")[1].split("### ")[0]
    assert "first diverging step **3**; 2 of 4 steps out of tolerance" in section
    assert "- **where**: stage(s) 1; layer(s) 5, 6" in section
    assert _row(section, "`h.6.mlp.c_fc.weight`")[:5] == ["`h.6.mlp.c_fc.weight`", "1", "6",
                                                          "512/1024", "0.03"]
    assert "`/runs/20260102-010000-2/cases/pipeline_layout/gpt2/pp2-costs-L4.5/logs/ranks/1.log`" \
        in section
    assert "![gradient error of pipeline_layout/gpt2/pp2-costs-L4.5](report-gradients-" in section
    error = text.split("### `basic/llama3/tp2`: error")[1]
    assert "> basic/llama3/tp2: ReferenceError: the reference run of llama3 failed" in error


def test_layout_throughput_section(failing_report):
    text = failing_report.markdown.split("## Layout throughput")[1].split("\n## ")[0]
    gpt2, llama3 = text.split("### llama3")
    assert "tokens/s relative to the uniform layout `4,4`." in gpt2
    # case, layout, VPP, tokens/s, spread, ratio, change, noise band, verdict, status
    assert _row(gpt2, "`basic/gpt2/pp2`")[3:9] == ["1,200", "±1.2%", "1.000", "–", "–", "uniform"]
    assert _row(gpt2, "`pipeline_layout/gpt2/pp2-partition-3-5`")[3:9] == [
        "1,100", "±1.2%", "0.917", "-8.3%", "±1.6%", "slower"]
    assert _row(gpt2, "`pipeline_layout/gpt2/pp2-costs-L4.5`")[5:9] == [
        "0.792", "-20.8%", "±1.6%", "slower"]
    assert "this group has no uniform case (add one without a layout flag): relative to the " \
           "fastest, `6,2`" in llama3
    assert _row(llama3, "`pipeline_layout/llama3/pp2-costs-L4.5`")[8] == "fastest"
    assert _row(llama3, "`pipeline_layout/llama3/pp2-partition-3-5`")[5:9] == [
        "0.889", "-11.1%", "±1.6%", "slower"]
    assert "On CPU these numbers say little" not in text  # CUDA records


def test_plots_are_written_beside_the_markdown_and_linked(failing_report):
    names = sorted(p.name for p in failing_report.images)
    assert names == ["report-gradients-pipeline_layout-gpt2-pp2-costs-L4.5.png",
                     "report-loss-gpt2.png", "report-loss-llama3.png"]
    for image in failing_report.images:
        assert image.parent == failing_report.path.parent
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 5000
        assert f"]({image.name})" in failing_report.markdown


def test_a_passing_session_has_no_failures_section(passing, tmp_path):
    report = build(read_session([passing]), tmp_path / "r.md", with_plots=False)
    assert "**all recorded cases passed**" in report.markdown
    assert "## Failures" not in report.markdown and report.images == []


def test_a_partial_session_says_what_is_missing(tmp_path):
    folder = tmp_path / "sessions" / "20260103-010000-3"
    records = passing_session()
    write(folder / "results.jsonl", records[:2], trailer=json.dumps(records[2])[:50])
    (folder / "cases" / "pipeline_layout" / "gpt2" / "pp2-partition-3-5").mkdir(parents=True)
    report = build(read_session([folder / "results.jsonl"]), folder / "report.md",
                   with_plots=False)
    text = report.markdown.split("## Completeness")[1].split("\n## ")[0]
    assert "**1 case(s) have no result**" in text
    assert "`pipeline_layout/gpt2/pp2-partition-3-5`" in text
    assert "line 3: truncated (the session stopped while writing it)" in text
    assert "2 cases recorded" in report.markdown
    assert _row(report.markdown, "pipeline_layout", "gpt2")[-2:] == ["1", "1"]  # not recorded, total


def test_a_report_from_the_plugins_real_cpu_records(tmp_path):
    from pathlib import Path

    data = Path(__file__).parent / "data" / "cpu_session.jsonl"
    report = build(read_session([data]), tmp_path / "report.md")
    cases = report.markdown.split("## Cases")[1].split("\n## ")[0]
    assert _row(cases, "`pipeline_layout/gpt2/pp2-costs-L4.5`")[1] == "6,2"
    assert "tokens/s relative to the uniform layout `4,4`." in report.markdown
    text = report.markdown
    assert "- **device**: CPU (each device slot a gloo process)" in text
    assert "- **driver**: none needed (CPU session)" in text
    assert "peak MB (CPU: process RSS)" in text and "process's peak resident memory" in text
    # harness.result/1 records hold no step times: nothing is called faster or slower
    throughput = text.split("## Layout throughput")[1].split("\n## ")[0]
    assert "On CPU these numbers say little" in throughput
    assert "not judged (fewer than 2 timed steps)" in throughput
    assert "| slower" not in throughput and "| faster" not in throughput
    assert [p.name for p in report.images] == ["report-loss-gpt2.png"]
