"""A session of a foreign trainer (InfiniTrain's binaries) in the report: a resumed run's losses
drawn at its own steps (31..50, not 1..20), the memory column holding the trainer's own figure
(a CPU build's `peak used: 0 MB` shown as no figure, with a footnote), and no torch or gloo
facts where no torch ran: the header names the trainer, its build and the device instead.

`data/infinitrain_cpu_session.jsonl` holds four records the plugin wrote running
InfiniTrain's config through the `infinitrain` backend against the stand-in build
(tests/infinitrain_standin), paths moved to /opt/infinitrain and /data; `peak_memory_mb` is 0,
as InfiniTrain's CPU build prints it (the stand-in prints 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import build, read_session
from harness.report.case_view import view
from harness.report.steps import first_step, reference_steps, run_steps
from harness.results.session import new_header, write_header

from .markdown import row
from .records import passing_session, write

DATA = Path(__file__).parent / "data" / "infinitrain_cpu_session.jsonl"
RESUMED = "checkpoint/gpt2/ckpt_resume"
BUILD = {"name": "infinitrain", "version": "infinitrain-3f2a9c0d1e2f3a4b",
         "build_dir": "/opt/infinitrain/build", "device": "cpu"}


def _records() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def _copy(tmp_path: Path, records: list[dict] | None = None) -> Path:
    return write(tmp_path / "session" / "results.jsonl", records or _records())


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


# ---------------------------------------------------------------- steps


def test_the_fixture_is_what_the_runner_writes():
    records = _records()
    resumed = next(r for r in records if r["name"] == RESUMED)
    assert {r["trainer"] for r in records} == {"infinitrain"}
    assert all(r["environment"] is None and r["device"] == "cpu" for r in records)
    assert all(r["peak_memory_mb"] == 0 for r in records)
    assert resumed["flags"]["load"].endswith("/checkpoint_step_000030")
    assert len(resumed["losses"]) == len(resumed["reference_losses"]) == 20
    assert "steps" not in resumed and "reference_steps" not in resumed  # not written (yet)


def test_a_resumed_runs_steps_start_after_its_checkpoint():
    resumed = next(r for r in _records() if r["name"] == RESUMED)
    assert first_step(resumed) == 31
    assert run_steps(resumed) == reference_steps(resumed) == list(range(31, 51))
    assert run_steps({"losses": [1.0, 2.0], "flags": {}}) == [1, 2]
    assert run_steps({"losses": [1.0], "flags": None}) == [1]
    # The record's own step numbers win; the reference's default to the run's.
    given = {"losses": [1.0, 2.0], "steps": [5, 7], "reference_losses": [1.0, 2.0],
             "flags": {"load": "/x/checkpoint_step_000030"}}
    assert run_steps(given) == reference_steps(given) == [5, 7]
    assert reference_steps({**given, "reference_steps": [1, 2]}) == [1, 2]
    # Steps that do not fit the losses (another length, not whole numbers) are not used.
    assert run_steps({**given, "steps": [5]}) == [31, 32]
    assert run_steps({**given, "steps": [5.5, 6]}) == [31, 32]


def test_the_report_keeps_a_records_steps(tmp_path):
    records = _records()
    resumed = next(r for r in records if r["name"] == RESUMED)
    resumed["steps"] = list(range(31, 51))
    session = read_session([_copy(tmp_path, records)])
    (back,) = [r for r in session.records if r["name"] == RESUMED]
    assert back["steps"] == list(range(31, 51)) and back["reference_steps"] is None
    assert not session.bad_lines


def _figure(monkeypatch, views, path):
    """loss_figure's matplotlib figure, caught as it is saved."""
    import matplotlib.pyplot as plt

    from harness.report.plots import loss_figure

    caught = {}
    real_save = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        caught["fig"] = fig
        return real_save(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    assert loss_figure("gpt2", views, path) == path
    return caught["fig"]


@pytest.mark.parametrize("recorded_steps", [False, True])
def test_a_resumed_run_is_drawn_at_its_own_steps(tmp_path, monkeypatch, recorded_steps):
    """Steps 31..50 at x = 31..50 on the reference line, in both panels, whether the record
    says its steps or they come from its `load` flag."""
    records = [r for r in _records() if r["name"] in (RESUMED, "checkpoint/gpt2/ckpt_no_resume")]
    if recorded_steps:
        records[-1]["steps"] = list(range(31, 51))
        records[-1]["flags"] = {k: v for k, v in records[-1]["flags"].items() if k != "load"}
    assert records[-1]["name"] == RESUMED
    figure = _figure(monkeypatch, [view(r) for r in records], tmp_path / "loss.png")
    top, bottom = figure.axes
    reference, full, resumed = top.get_lines()[:3]
    assert list(reference.get_xdata()) == list(range(1, 51))
    assert list(full.get_xdata()) == list(range(1, 51))
    assert list(resumed.get_xdata()) == list(range(31, 51))
    # On the line: the resumed run's loss at step 31 is the reference's at step 31.
    assert resumed.get_ydata()[0] == pytest.approx(reference.get_ydata()[30])
    diffs = [l for l in bottom.get_lines() if l.get_label().startswith("ckpt_resume")]
    (xs,) = [list(l.get_xdata()) for l in diffs]
    assert round(min(xs)) == 31 and round(max(xs)) == 50


def test_a_resumed_runs_own_reference_is_drawn_from_its_first_step(tmp_path, monkeypatch):
    """Only the resumed case: the reference line is steps 31..50 too."""
    (resumed,) = [r for r in _records() if r["name"] == RESUMED]
    figure = _figure(monkeypatch, [view(resumed)], tmp_path / "loss.png")
    reference, run = figure.axes[0].get_lines()[:2]
    assert list(reference.get_xdata()) == list(run.get_xdata()) == list(range(31, 51))


# ---------------------------------------------------------------- memory


def test_the_memory_column_is_the_trainers_own_figure(tmp_path):
    text = build(read_session([_copy(tmp_path)]), tmp_path / "r.md", with_plots=False).markdown
    cases = _section(text, "Cases")
    assert "peak MB (trainer's own figure)" in cases
    assert "process RSS" not in cases and "ru_maxrss" not in cases
    assert row(cases, f"`{RESUMED}`")[13] == "—"  # 0 MB from the CPU build: no figure
    assert "InfiniTrain's CPU build reports peak used: 0 MB" in cases
    assert "not measured by the harness" in cases


def test_a_foreign_trainers_nonzero_figure_is_shown(tmp_path):
    records = _records()
    for r in records:
        r.update(device="cuda", peak_memory_mb=1536.0)
    text = build(read_session([_copy(tmp_path, records)]), tmp_path / "r.md",
                 with_plots=False).markdown
    cases = _section(text, "Cases")
    assert row(cases, f"`{RESUMED}`")[13] == "1,536"
    assert "peak MB (trainer's own figure)" in cases
    assert "peak used: 0 MB" not in cases and "max_memory_allocated" not in cases


def test_a_session_of_both_trainers_labels_each_figure(tmp_path):
    bundled = passing_session()[0]
    bundled["device"] = "cpu"
    text = build(read_session([_copy(tmp_path, [bundled, *_records()])]), tmp_path / "r.md",
                 with_plots=False).markdown
    cases = _section(text, "Cases")
    assert "peak MB (CPU: process RSS; other trainers: their own figure)" in cases
    assert row(cases, "`basic/gpt2/single`")[13] == "2,048"
    assert row(cases, f"`{RESUMED}`")[13] == "—"
    assert "Peak MB of the bundled trainer (harness): on CUDA" in cases
    assert "InfiniTrain's CPU build reports peak used: 0 MB" in cases
    assert "- **torch**: 2.13.0+cu128" in text  # the bundled trainer ran: torch applies


# ---------------------------------------------------------------- header: no torch, no gloo


def test_a_foreign_session_without_a_trainer_header_names_the_records_trainer(tmp_path):
    text = build(read_session([_copy(tmp_path)]), tmp_path / "r.md", with_plots=False).markdown
    assert "- **trainer**: infinitrain (build not recorded), device cpu" in text
    assert "- **device**: CPU\n" in text
    assert "- **torch**" not in text and "gloo" not in text


def test_the_header_names_the_trainers_build_and_device(tmp_path):
    results = _copy(tmp_path)
    header = new_header("20261201-210733-7260", "2026-12-01T21:07:33+0000", None, tmp_path,
                        ["--harness-trainer", "infinitrain"], trainer=dict(BUILD))
    header["torch"] = "2.13.0+cpu"  # the controller's torch: recorded, never shown here
    write_header(results.parent, header)
    text = build(read_session([results]), tmp_path / "r.md", with_plots=False).markdown
    assert ("- **trainer**: infinitrain (build infinitrain-3f2a9c0d1e2f3a4b, "
            "/opt/infinitrain/build), device cpu") in text
    assert "torch" not in text.split("## ")[1]  # the header section
    assert "2.13.0" not in text and "gloo" not in text
    assert "- **driver**: none needed (CPU session)" in text


def test_a_bundled_session_keeps_its_torch_and_gloo_lines(tmp_path):
    from pathlib import Path as P

    data = P(__file__).parent / "data" / "cpu_session.jsonl"
    text = build(read_session([data]), tmp_path / "r.md", with_plots=False).markdown
    assert "- **torch**: " in text and "- **trainer**" not in text
    assert "- **device**: CPU (each device slot a gloo process)" in text
    assert "peak MB (CPU: process RSS)" in text


def test_a_bundled_session_with_a_trainer_header_names_it_and_keeps_torch(tmp_path):
    results = write(tmp_path / "s" / "results.jsonl", passing_session())
    header = new_header("20260101-010000-1", "2026-01-01T01:00:00+0000", None, tmp_path, [],
                        trainer={"name": "harness", "version": "harness-0123abcd",
                                 "build_dir": None, "device": "cuda"})
    write_header(results.parent, header)
    text = build(read_session([results]), tmp_path / "r.md", with_plots=False).markdown
    assert "- **trainer**: harness (version harness-0123abcd), device cuda" in text
    assert "- **torch**: 2.13.0+cu128 (CUDA 12.8)" in text


def test_foreign_cases_on_cpu_claim_no_gloo_in_the_throughput_section(tmp_path):
    """The layout groups of a foreign CPU session: the CPU caveat without gloo processes."""
    records = passing_session()
    for r in records:
        r.update(trainer="infinitrain", device="cpu", environment=None, peak_memory_mb=0.0)
    text = build(read_session([_copy(tmp_path, records)]), tmp_path / "r.md",
                 with_plots=False).markdown
    throughput = _section(text, "Layout throughput")
    assert "On CPU these numbers say little" in throughput
    # The baseline line names the option `--harness-baseline pytorch`; no torch fact is claimed.
    from harness.results.baseline_summary import NONE_CHECKED

    assert NONE_CHECKED in text  # a foreign session without a baseline says so
    text = text.replace(NONE_CHECKED, "")
    assert "gloo" not in text and "torch" not in text
    assert "ru_maxrss" not in text


def test_comparing_two_foreign_sessions_shows_the_build_not_torch(tmp_path):
    from harness.report.session_diff import settings_differences

    records = _records()
    old = {"torch": "2.12.0+cpu", "trainer": dict(BUILD)}
    new = {"torch": "2.13.0+cpu", "trainer": {**BUILD, "version": "infinitrain-0000"}}
    diffs = settings_differences(old, new, records, records)
    assert diffs == [("trainer build", "infinitrain-3f2a9c0d1e2f3a4b", "infinitrain-0000")]
    bundled = passing_session()
    assert ("torch", "2.12.0+cpu", "2.13.0+cpu") in settings_differences(
        old, new, bundled, bundled)
