"""Docs as tests: the README's and the guides' pasteable commands, run literally.

A code block (4-space indented, or fenced ```bash / ```sh / ```console) preceded by
`<!-- docs-test: run -->` is run as written by bash, blocks of a file in order, in one fresh
folder (so `assets/` and `reports/` land there, not in the repository; the folder's `configs`
and `tests` are the checkout's, so a block reads as run from the checkout); a block preceded by
`<!-- docs-test: collect -->` is too heavy to run here (the full pipeline_layout job): each of
its `python -m pytest` commands is run from the repository root with `--collect-only -q`
appended, which checks its options, markers and config. Every command line of every block in
these files is checked for a `...` left in place of real arguments.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*docs-test:\s*(run|collect)\s*-->")
COMMAND = re.compile(r"^\$?\s*(python|torchrun|pytest)\b")


def blocks(path: Path) -> list[tuple[str | None, list[str]]]:
    """(mark, command lines with continuations joined) for every code block of a file."""
    lines = path.read_text().splitlines()
    found, i, mark = [], 0, None
    while i < len(lines):
        line = lines[i]
        if MARK.search(line):
            mark = MARK.search(line).group(1)
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if line.strip("`").strip() in ("bash", "sh", "console", "shell", ""):
                found.append((mark, _commands(lines[i + 1:j])))
            mark, i = None, j
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip()
                                          or MARK.search(lines[i - 1])):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            found.append((mark, _commands([x[4:] for x in lines[i:j]])))
            mark, i = None, j - 1
        elif line.strip():
            mark = None if not line.startswith("<!--") else mark
        i += 1
    return found


def _commands(lines: list[str]) -> list[str]:
    joined, current = [], ""
    for line in lines:
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        if current.strip():
            joined.append(current.strip())
        current = ""
    return joined


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(ROOT)}


def test_no_placeholder_dots_in_commands():
    bad = [f"{path.relative_to(ROOT)}: {command}" for path in DOCS for _, commands in blocks(path)
           for command in commands if COMMAND.match(command) and "..." in command]
    assert bad == []


def test_the_marked_blocks_exist():
    marks = [mark for _, commands in blocks(ROOT / "README.md") for mark in [_] if mark]
    assert marks.count("run") >= 2 and "collect" in marks


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in DOCS if any(m == "run" for m, _ in blocks(p))],
                         ids=lambda p: p.name)
def test_run_blocks_run_as_written(path, tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # its fixtures: real logs the docs judge
    for mark, commands in blocks(path):
        if mark != "run":
            continue
        script = "set -euo pipefail\n" + "\n".join(commands)
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{path.name}:\n{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("path", [p for p in DOCS if any(m == "collect" for m, _ in blocks(p))],
                         ids=lambda p: p.name)
def test_collect_blocks_collect(path):
    for mark, commands in blocks(path):
        if mark != "collect":
            continue
        for command in commands:
            if not command.startswith("python -m pytest"):
                continue
            done = subprocess.run(["bash", "-c", command + " --collect-only -q -p no:cacheprovider"],
                                  cwd=ROOT, env=_env(), capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            assert re.search(r"\d+(/\d+)? tests? collected", done.stdout), done.stdout[-2000:]
