"""The nightly command run again into the same output folder: pytest finds its rootdir and its
config file before the harness's options are known, from the command line's existing paths,
and `--harness-output /srv/nightly` (two words) is one of them once the folder exists. Found
on a second run of the README's main job into a folder outside the checkout: the first night
ran 50 cases, the second collected none (rootdir `/`, no config file: exit 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-m", "pipeline_layout", "--gpus", "8",
                           "-p", "no:cacheprovider", "--collect-only", "-q", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_an_existing_output_folder_outside_the_checkout_is_refused_with_the_fix(tmp_path):
    """Plant: the plugin's rootdir check removed: the second night collects nothing (exit 5),
    and this test fails on the exit code."""
    out = tmp_path / "nightly"
    out.mkdir()  # the first night made it
    refused = _collect("--harness-output", str(out))
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = refused.stderr + refused.stdout
    assert f"--harness-output {out}: pytest read this path as a test path" in said
    assert f"Write --harness-output={out} (one word), or add --rootdir={REPO}" in said
    for fixed in ([f"--harness-output={out}"], ["--harness-output", str(out), "--rootdir",
                                                 str(REPO)]):
        done = _collect(*fixed)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "50/" in done.stdout.splitlines()[-1]  # the 50 pipeline_layout cases
