"""harness.launch.process: a run past its timeout is killed with its whole process group; ending
processes is SIGTERM, then SIGKILL after the grace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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


# A process that ignores SIGTERM and says so once it does: only SIGKILL ends it.
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")


def _stubborn(**popen) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, **popen)
    assert process.stdout.readline() == b"ready\n"
    return process


def test_ending_processes_is_sigterm_then_sigkill_after_the_grace_and_reaped():
    """process.end_processes, the one way the reaper, the zygote's leader and end_group end
    processes: SIGTERM, SIGKILL only once grace_s is over, the exited ones reaped, checked by
    pid."""
    from harness.launch.process import end_processes

    process = _stubborn()
    started = time.monotonic()
    seen = end_processes(lambda: [process.pid] if process.poll() is None else [], 0.5,
                         reap=process.poll)
    assert seen == [process.pid]
    assert process.returncode == -signal.SIGKILL  # SIGTERM was ignored
    assert time.monotonic() - started >= 0.5
    assert end_processes(lambda: [], 0.5) == []  # nothing alive: returns at once


def test_ending_a_group_ends_each_live_member_by_pid():
    from harness.launch.process import end_group, group_members

    leader = _stubborn(start_new_session=True)
    assert group_members(leader.pid) == [leader.pid]
    end_group(leader.pid, 0.3)
    assert leader.wait(timeout=10) == -signal.SIGKILL
    assert group_members(leader.pid) == []
