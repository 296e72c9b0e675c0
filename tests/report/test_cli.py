"""`python -m harness.report`: the default session, explicit paths, -o, --compare, no results."""

from __future__ import annotations

import subprocess
import sys

from harness.report.cli import main


def test_default_is_the_latest_session_under_reports_harness(tmp_path, monkeypatch, capsys):
    root = tmp_path / "reports" / "harness"
    from .records import failing_session, write

    write(root / "sessions" / "20260101-000000-1" / "results.jsonl", failing_session()[:1])
    latest = write(root / "sessions" / "20260102-000000-1" / "results.jsonl", failing_session())
    monkeypatch.chdir(tmp_path)
    assert main(["--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out == (f"report: {latest.parent.resolve() / 'report.md'} (8 cases: 5 passed, 1 failed, "
                   "1 skipped, 1 error)\n")
    assert (latest.parent / "report.md").is_file()


def test_explicit_paths_output_and_compare(passing, failing, tmp_path, capsys):
    out = tmp_path / "night" / "nightly.md"
    assert main([str(failing.parent), "-o", str(out), "--compare", str(passing), "--no-plots",
                 "--about", "driver=550.54", "--about", "workflow run=https://ci/1"]) == 0
    assert capsys.readouterr().out.startswith(f"report: {out} (8 cases")
    text = out.read_text()
    assert "## Against session 20260101-010000-1" in text
    assert "- **driver**: 550.54" in text and "- **workflow run**: https://ci/1" in text
    assert not list(out.parent.glob("*.png"))


def test_no_results_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([]) == 2
    assert "no results found: no reports/harness/sessions/*/results.jsonl" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert main(["--about", "driver"]) == 2
    assert "--about 'driver': expected KEY=VALUE" in capsys.readouterr().err


def test_module_entry_point(passing, tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.report", str(passing), "--no-plots",
                           "-o", str(tmp_path / "r.md")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("report: ")
