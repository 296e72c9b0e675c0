"""harness.launch.process: a run past its timeout is killed with its whole process group."""

from __future__ import annotations

import os
import sys

import pytest

from harness.launch import run_process


def test_timeout_kills_the_whole_process_group(tmp_path):
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(c.pid, flush=True); time.sleep(60)")
    result = run_process([sys.executable, "-c", script], os.environ, 1.0,
                         tmp_path / "out", tmp_path / "err")
    assert result.timed_out and result.returncode is None and not result.ok
    child = int((tmp_path / "out").read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
