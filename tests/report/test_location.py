"""`python -m harness.report` with no argument, from any working directory: $HARNESS_OUTPUT,
then the last-session pointer the plugin writes, then ./reports/harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.report.cli import main
from harness.results.location import record_last_session

from .records import failing_session, passing_session, write


def test_the_pointer_finds_the_session_from_another_folder(tmp_path, monkeypatch, capsys):
    session = write(tmp_path / "repo" / "reports" / "harness" / "sessions" / "20260101-000000-1"
                    / "results.jsonl", failing_session())
    record_last_session(session.parent)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["--no-plots"]) == 0
    assert capsys.readouterr().out.startswith(f"report: {session.parent.resolve() / 'report.md'}")


def test_harness_output_wins_and_is_read_by_a_subprocess_elsewhere(tmp_path):
    pointed = write(tmp_path / "a" / "sessions" / "20260101-000000-1" / "results.jsonl",
                    failing_session())
    record_last_session(pointed.parent)
    output = tmp_path / "b"
    chosen = write(output / "sessions" / "20260102-000000-1" / "results.jsonl", passing_session())
    env = {**os.environ, "HARNESS_OUTPUT": str(output)}
    done = subprocess.run([sys.executable, "-m", "harness.report", "--no-plots"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"report: {chosen.parent.resolve() / 'report.md'}")
    empty = {**env, "HARNESS_OUTPUT": str(tmp_path / "nothing")}
    done = subprocess.run([sys.executable, "-m", "harness.report"], cwd=tmp_path, env=empty,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "from $HARNESS_OUTPUT" in done.stderr


def test_a_pointer_to_a_removed_folder_falls_back_to_the_cwd(tmp_path, monkeypatch, capsys):
    record_last_session(tmp_path / "gone")
    local = write(tmp_path / "reports" / "harness" / "sessions" / "20260101-000000-1"
                  / "results.jsonl", passing_session())
    monkeypatch.chdir(tmp_path)
    assert main(["--no-plots"]) == 0
    assert capsys.readouterr().out.startswith(f"report: {local.parent.resolve() / 'report.md'}")
    assert Path(os.environ["HARNESS_LAST_SESSION"]).read_text().strip().endswith("gone")
