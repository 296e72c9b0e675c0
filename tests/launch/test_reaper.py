"""harness.launch.reaper and process.start / end: every process of a run ends, checked by pid,
whatever session it started, on each way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from harness.launch.process import end, start
from tests.reliability.checks import alive

# A rank as torch 2.13's torchrun starts it: in a session of its own, writing its pid.
ORPHAN = ("import os, subprocess, sys, time; "
          "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
          "start_new_session=True); "
          "open(sys.argv[1], 'w').write(str(c.pid)); ")


def _pid(path, timeout=30.0) -> int:
    deadline = time.monotonic() + timeout
    while not (path.is_file() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.02)
    return int(path.read_text())


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_orphan_in_its_own_session_is_ended_when_the_command_exits(tmp_path):
    err = open(tmp_path / "err", "wb")
    process = start([sys.executable, "-c", ORPHAN + "sys.exit(3)", tmp_path / "pid"], os.environ,
                    subprocess.DEVNULL, err, exit_file=tmp_path / "exit.json")
    assert process.wait(timeout=60) == 3  # the command's own exit code
    orphan = _pid(tmp_path / "pid")
    assert _gone(orphan)
    assert f"reaper: ended 1 process(es) of the run still alive after the command exited: " \
           f"pid {orphan} (python" in (tmp_path / "err").read_text()
    assert json.loads((tmp_path / "exit.json").read_text())["returncode"] == 3


def test_a_signal_death_is_passed_on(tmp_path):
    process = start([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), "
                     "signal.SIGSEGV)"], os.environ, subprocess.DEVNULL, subprocess.DEVNULL)
    assert process.wait(timeout=60) == -signal.SIGSEGV


def test_ending_a_run_ends_every_descendant(tmp_path):
    process = start([sys.executable, "-c", ORPHAN + "time.sleep(120)", tmp_path / "pid"],
                    os.environ, subprocess.DEVNULL, subprocess.DEVNULL)
    orphan = _pid(tmp_path / "pid")
    started = time.monotonic()
    end(process)
    assert _gone(orphan, timeout=0.5) and time.monotonic() - started < 10
    assert not alive(process.pid)


def test_the_run_ends_when_its_launcher_is_killed(tmp_path):
    """pytest killed by SIGKILL: the reaper dies with its parent and takes the run with it."""
    launcher = (f"import os, subprocess, sys, time; sys.path.insert(0, {os.getcwd()!r}); "
                "from harness.launch.process import start; "
                f"p = start([sys.executable, '-c', {ORPHAN + 'time.sleep(120)'!r}, sys.argv[1]], "
                "os.environ, subprocess.DEVNULL, subprocess.DEVNULL); "
                "print(p.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", launcher, tmp_path / "pid"],
                              stdout=subprocess.PIPE, text=True)
    try:
        reaper = int(parent.stdout.readline())
        orphan = _pid(tmp_path / "pid")
        parent.kill()
        parent.wait()
        assert _gone(reaper) and _gone(orphan)
    finally:
        parent.kill()
