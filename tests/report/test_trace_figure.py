"""The module trace picture (issue 46; harness.report.trace, harness.report.trace_plot): the
points it draws from a record's `trace` (execution order, error over threshold, NaN and exact 0
rows, the first diverging and last matched entries), the marks on the drawn figure, and the
case's section of report.md (the picture linked, the trace's line as caption, its cost and
unpaired counts; a skipped or failed trace's one line), down to `python -m harness.report`.

Traces are written by hand in the record's shape (the result record's `trace`, the lead's
harness/results/result_record.py): GPT-2 names as the bundled trainer gives them."""

from __future__ import annotations

import math

import pytest

from harness.report import build, read_session
from harness.report.trace import (
    LINK_KEY,
    block_ticks,
    phase_split,
    short_name,
    trace_lines,
    trace_marks,
    trace_points,
)
from harness.report.trace_plot import FIRST_GID, LAST_GID, rows, trace_axes, trace_figure
from harness.results import FIELDS

from .records import case, diverged, write

THRESHOLD = 3.9e-6


def entry(order, module, phase="forward", ratio=0.01, rank=0, index=0, **extra) -> dict:
    values = {"module": module, "phase": phase, "index": index, "rank": rank, "order": order,
              "shape": [4, 64, 48], "max_abs": ratio * THRESHOLD, "max_ref": 0.4,
              "threshold": THRESHOLD, "ratio": ratio, "ok": ratio <= 1, "nan": 0, "note": None}
    return {**values, **extra}


def gpt2_trace(layers=2, plant="h.1.mlp.gelu", nan_at=None) -> dict:
    """A diverged trace of GPT-2 with `layers` blocks, in InfiniTrain's execution order (as its
    precision_check log has it): everything before `plant`'s forward output matches (the first
    two exactly), everything from it on is over; `nan_at`: a backward module that is NaN.
    `modules` is listed backward pass first, so the list's order is not the execution order."""
    block = ["ln_1", "attn.c_attn", "attn.c_proj", "attn", "ln_2", "mlp.c_fc", "mlp.gelu",
             "mlp.c_proj", "mlp", ""]
    forward = ["wte", "wpe"] + [f"h.{i}.{m}".rstrip(".") for i in range(layers) for m in block]
    forward += ["ln_f", "lm_head", "CrossEntropyLoss"]
    backward = ["CrossEntropyLoss", "lm_head", "ln_f"]
    backward += [f"h.{i}.{m}".rstrip(".") for i in reversed(range(layers))
                 for m in reversed(block)]
    backward += ["wte", "wpe"]
    entries, over = [], False
    for order, (module, phase) in enumerate([(m, "forward") for m in forward]
                                            + [(m, "backward") for m in backward]):
        over = over or (module == plant and phase == "forward")
        ratio = 0.0 if order < 2 else (700.0 + order if over else 0.01 * (1 + order % 4))
        e = entry(order, module, phase, ratio)
        if module == plant and phase == "forward":
            e["ratio"], e["max_abs"] = 2.8e3, 2.8e3 * THRESHOLD
        if module == nan_at and phase == "backward":
            e.update(max_abs="nan", ratio="nan", ok=False, nan=12, note="NaN in run")
        entries.append(e)
    first = next((e for e in entries if not e["ok"]), None)
    last = entries[entries.index(first) - 1] if first else entries[-1]
    return {
        "status": "diverged", "reason": None, "step": 1, "partner": "reference",
        "line": (f"first diverging: {plant} forward (rank 0): max |d| 1.1e-2 > 3.9e-6; "
                 f"last that matched: {last['module']} forward, 4e-8"),
        "first_diverging": first, "last_matched": last,
        "modules": [e for e in entries if e["phase"] == "backward"]
        + [e for e in entries if e["phase"] == "forward"],
        "unpaired": {"run": ["TransformerFirstStage forward (InfiniTrain's container only)"],
                     "partner": []},
        "thresholds": {"atol": 1e-5, "rtol": 0.0, "source": "measured"},
        "cost": {"seconds": 0.23, "peak_bytes": 12_300_000, "tensors": 96,
                 "bytes_read": 48_100_000}}


def failed_case(trace=None, baseline_trace=None, **kwargs) -> dict:
    record = diverged(case("pipeline_layout", "gpt2", "pp2-costs-L4.5",
                           chunks=[(0, 0, 6), (1, 6, 8)], **kwargs))
    if trace is not None:
        record["trace"] = trace
    if baseline_trace is not None:
        record["baseline"] = {"status": "diverged", "source": "pytorch", "trace": baseline_trace}
    return record


def session_of(tmp_path, records):
    """The session of `records` as the report reads it from results.jsonl; until the result
    record carries `trace` (FIELDS), read_session drops it: put back as written."""
    session = read_session([write(tmp_path / "results.jsonl", records)])
    if "trace" not in FIELDS:
        for read, written in zip(session.records, records):
            if "trace" in written:
                read["trace"] = written["trace"]
    return session


# ------------------------------------------------------------------------- the points


def test_points_in_execution_order_with_ratios_and_marks():
    trace = gpt2_trace(layers=2, plant="h.1.mlp.gelu")
    points = trace_points(trace)
    assert [p.x for p in points] == list(range(len(trace["modules"])))  # by order, not list
    assert [p.phase for p in points] == ["forward"] * 25 + ["backward"] * 25
    assert points[0].module == "wte" and points[0].ratio == 0.0 and points[0].ok
    by = {(p.module, p.phase): p for p in points}
    gelu = by[("h.1.mlp.gelu", "forward")]
    assert gelu.ratio == pytest.approx(2.8e3) and not gelu.ok and gelu.layer == 1
    assert gelu.label == "h.1 mlp.gelu forward"
    assert all(p.ok for p in points if p.x < gelu.x)
    assert not any(p.ok for p in points if p.x >= gelu.x)
    first, last = trace_marks(trace, points)
    assert first is gelu and first.x == trace["first_diverging"]["order"] == 18
    assert last.x == 17 and (last.module, last.phase) == ("h.1.mlp.c_fc", "forward")
    # the separator between the passes, and a label at each block, not at each entry
    assert phase_split(points) == 24.5
    ticks = dict(block_ticks(points))
    assert ticks[0] == "wte …" and ticks[2] == "h.0" and ticks[12] == "h.1"
    assert ticks[22] == "ln_f …" and ticks[25] == "CrossEntropyLoss …"
    assert ticks[28] == "h.1" and ticks[38] == "h.0" and ticks[48] == "wte …"
    assert len(ticks) == 8


def test_names_and_a_ratio_the_entry_does_not_give():
    assert short_name("transformer.h.3.attn.c_attn") == "h.3 attn.c_attn"
    assert short_name("h.3") == "h.3" and short_name("transformer.wte") == "wte"
    assert short_name("CrossEntropyLoss") == "CrossEntropyLoss"
    (point,) = trace_points({"modules": [{"module": "h.0.ln_1", "phase": "backward",
                                           "rank": 1, "max_abs": 2e-5, "threshold": 1e-5}]})
    assert point.ratio == pytest.approx(2.0) and not point.ok and point.x == 0
    assert point.label == "h.0 ln_1 backward (rank 1)"


def test_a_nan_entry_is_its_own_row_above_the_rest():
    trace = gpt2_trace(layers=2, plant="h.1.mlp.gelu", nan_at="h.0.attn")
    points = trace_points(trace)
    bad = [p for p in points if p.nan]
    assert [(p.module, p.phase) for p in bad] == [("h.0.attn", "backward")]
    assert math.isnan(bad[0].ratio) and not bad[0].ok
    floor, top, nan_row = rows(points)
    assert top == pytest.approx(2.8e3) and nan_row > top and floor == pytest.approx(0.01 / 100)
    # a NaN the record spells as a count only (ratio absent) is NaN too
    (counted,) = trace_points({"modules": [{**entry(3, "h.0.ln_1"), "nan": 4,
                                                     "ratio": None, "ok": None}]})
    assert counted.nan and not counted.ok


# ------------------------------------------------------------------------- the figure


def _marks(fig) -> dict[str, tuple[float, float]]:
    return {a.get_gid(): a.xy for a in fig.axes[0].texts if a.get_gid()}


def test_the_first_diverging_mark_is_on_its_entry():
    """Planted bug: the mark put on the list's first entry over the threshold, on the worst
    entry, or at the entry's position in `modules` instead of its `order`, fails here. The
    entries are listed backward pass first, the worst ratio is later, and `order` starts at 5."""
    import matplotlib.pyplot as plt

    trace = gpt2_trace(layers=2, plant="h.0.mlp.gelu")
    for e in trace["modules"]:
        e["order"] += 5
    first = trace["first_diverging"]
    trace["modules"][3]["ratio"] = 1e5  # a backward entry, the worst
    assert first["order"] == 13 and trace["modules"].index(first) != 13
    worst = max(trace["modules"], key=lambda e: e["ratio"])
    assert worst is not first
    listed_first_over = next(e for e in trace["modules"] if not e["ok"])
    assert listed_first_over is not first
    fig = trace_axes(trace, "planted")
    try:
        marks = _marks(fig)
        assert marks[FIRST_GID][0] == first["order"] == 13
        assert marks[FIRST_GID][1] == pytest.approx(2.8e3)
        assert marks[LAST_GID][0] == trace["last_matched"]["order"] == 12
        label = next(t.get_text() for t in fig.axes[0].texts if t.get_gid() == FIRST_GID)
        assert label.startswith("first diverging: h.0 mlp.gelu forward")
        # the star sits on the same entry
        stars = [c for c in fig.axes[0].collections if c.get_label() == "first diverging"]
        assert [tuple(xy) for xy in stars[0].get_offsets()] == [(13, pytest.approx(2.8e3))]
        # the separator between the passes, the threshold line at 1
        lines = fig.axes[0].get_lines()
        assert any(list(l.get_ydata()) == [1.0, 1.0] for l in lines)
        assert any(list(l.get_xdata()) == [29.5, 29.5] for l in lines)
    finally:
        plt.close(fig)


def test_nan_and_zero_rows_on_the_figure(tmp_path):
    import matplotlib.pyplot as plt

    trace = gpt2_trace(layers=2, nan_at="h.0.attn")
    fig = trace_axes(trace, "nan")
    try:
        axis = fig.axes[0]
        nans = [c for c in axis.collections if c.get_label().startswith("NaN / inf")]
        floor, _, nan_row = rows(trace_points(trace))
        nan_entry = next(e for e in trace["modules"] if e["nan"])
        assert [tuple(xy) for xy in nans[0].get_offsets()] == [(nan_entry["order"], nan_row)]
        labels = [t.get_text() for t in axis.get_yticklabels()]
        assert labels[0] == "exactly 0" and labels[-1] == "NaN / inf"
        zeros = [tuple(xy) for c in axis.collections if c.get_label() == "within the threshold"
                 for xy in c.get_offsets() if xy[1] == floor]
        assert [x for x, _ in zeros] == [0, 1]
    finally:
        plt.close(fig)
    assert trace_figure(trace, tmp_path / "t.png", "nan").stat().st_size > 10_000
    assert trace_figure({"status": "matched", "modules": []}, tmp_path / "none.png", "x") is None
    assert not (tmp_path / "none.png").exists()


# ------------------------------------------------------------------------- report.md


def test_a_failed_case_with_a_trace_has_its_picture_caption_and_cost(tmp_path):
    trace = gpt2_trace(layers=2, plant="h.1.mlp.gelu")
    baseline_trace = {**gpt2_trace(layers=2, plant="h.0.ln_1"), "partner": "pytorch baseline"}
    record = failed_case(trace, baseline_trace)
    report = build(session_of(tmp_path, [record]), tmp_path / "out" / "report.md")
    text = report.markdown
    name = record["name"]
    png = "report-trace-pipeline_layout-gpt2-pp2-costs-L4.5.png"
    baseline_png = "report-baseline-trace-pipeline_layout-gpt2-pp2-costs-L4.5.png"
    assert {png, baseline_png} <= {p.name for p in report.images}
    assert (tmp_path / "out" / png).stat().st_size > 10_000
    assert (tmp_path / "out" / baseline_png).is_file()
    failure = text.split(f"### `{name}`: failed")[1].split("\n## ")[0]
    assert f"against the reference: each module's error over its threshold in execution " \
           f"order]({png})" in failure
    assert f"]({baseline_png})" in failure
    assert "**Module trace of step 1** against the reference: diverged" in failure
    assert ("*first diverging: h.1.mlp.gelu forward (rank 0): max \\|d\\| 1.1e-2 > 3.9e-6; "
            "last that matched: h.1.mlp.c_fc forward, 4e-8*") in failure
    assert ("- 50 pairs compared; cost 0.23 s, peak 12.3 MB (96 tensors, 48.1 MB read); "
            "unpaired: 1 of the run's, 0 of the partner's") in failure
    assert "- run: `TransformerFirstStage forward (InfiniTrain's container only)`" in failure
    assert "**Module trace of step 1** against the pytorch baseline: diverged" in failure
    assert "## Module traces" not in text  # a failed case's traces are in its own section
    assert failure.index(png) < failure.index(baseline_png)


def test_a_skipped_or_failed_trace_is_one_line_with_its_reason(tmp_path):
    skipped = {"status": "skipped", "reason": "--trace none", "step": 4, "partner": "reference",
               "line": None, "first_diverging": None, "last_matched": None, "modules": [],
               "unpaired": {"run": [], "partner": []}, "thresholds": None, "cost": None}
    error = {**skipped, "status": "error", "reason": "the rerun of step 4 exited 1 | see log",
             "partner": "pytorch baseline"}
    record = failed_case(skipped, error)
    lines = trace_lines(record, record["name"])
    assert lines == ["- **Module trace of step 4** against the reference: skipped: --trace none",
                     "",
                     "- **Module trace of step 4** against the pytorch baseline: error: the "
                     "rerun of step 4 exited 1 \\| see log", ""]
    session = session_of(tmp_path, [record])
    report = build(session, tmp_path / "report.md")
    assert not [p for p in report.images if "trace" in p.name]
    assert not list(tmp_path.glob("*trace*.png")) and LINK_KEY not in session.records[0]
    failure = report.markdown.split("## Failures")[1].split("\n## ")[0]
    assert lines[0] in failure and lines[2] in failure


def test_a_passing_case_traced_shows_under_module_traces(tmp_path):
    matched = gpt2_trace(layers=1, plant="none")
    for e in matched["modules"]:
        e.update(ratio=0.01, max_abs=0.01 * THRESHOLD, ok=True)
    matched.update(status="matched", line=None, first_diverging=None)
    passing = case("basic", "gpt2", "pp2")
    passing["trace"] = matched
    report = build(session_of(tmp_path, [passing]), tmp_path / "report.md")
    section_text = report.markdown.split("## Module traces")[1].split("\n## ")[0]
    assert "### `basic/gpt2/pp2`: passed" in section_text
    assert "](report-trace-basic-gpt2-pp2.png)" in section_text
    assert "*every compared module matched*" in section_text


def test_python_m_harness_report_renders_the_picture(tmp_path, capsys):
    from harness.report.cli import main

    folder = tmp_path / "sessions" / "20260102-010000-2"
    record = failed_case(gpt2_trace(layers=2, plant="h.1.mlp.gelu"))
    write(folder / "results.jsonl", [record])
    assert main([str(folder)]) == 0
    text = (folder / "report.md").read_text()
    png = folder / "report-trace-pipeline_layout-gpt2-pp2-costs-L4.5.png"
    assert png.stat().st_size > 10_000
    assert f"]({png.name})" in text
    assert "*first diverging: h.1.mlp.gelu forward (rank 0)" in text
    assert "plot(s)" in capsys.readouterr().out


def test_the_replay_of_a_trace_is_shown_beside_it():
    """report.md gives a trace's replay: the blamed call's line, the next calls over their
    floors, or why it was not replayed."""
    from harness.report.trace import blame_lines
    over = [{"line": f"the gradient of h.{i}'s output, written by h.{i + 1}.ln_1's backward: "
                     f"local error 1e-05 relative, floor 1e-07 <- blamed"} for i in range(7)]
    blamed = {"status": "blamed", "line": "blamed: " + over[0]["line"], "over": over}
    lines = blame_lines({"blame": blamed})
    assert lines[0] == ("- **Each module on the subject's own inputs** (the replay): blamed: the "
                        "gradient of h.0's output, written by h.1.ln_1's backward: local error "
                        "1e-05 relative, floor 1e-07 <- blamed")
    assert lines[1].startswith("  - the gradient of h.1's output") and len(lines) == 7
    assert lines[5] == "  - and 2 more over their floors" and lines[-1] == ""
    skipped = {"status": "skipped", "reason": "not replayed: a multi-rank subject | x"}
    assert blame_lines({"blame": skipped}) == [
        "- **Each module on the subject's own inputs** (the replay): skipped: not replayed: a "
        "multi-rank subject \\| x", ""]
    assert blame_lines({"status": "matched"}) == []
    record = failed_case({"status": "matched", "step": 1, "partner": "pytorch baseline",
                          "line": None, "first_diverging": None, "last_matched": None,
                          "modules": [], "unpaired": {"run": [], "partner": []},
                          "thresholds": None, "cost": None, "blame": blamed})
    assert lines[0] in trace_lines(record, record["name"])
