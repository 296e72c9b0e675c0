"""The sessions a test starts skip the pytest plugins of installed packages that none of them
uses (tests/conftest.py: INNER_SESSION_ARGS), whether pytester starts them or a command does."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.conftest import INNER_SESSION_ARGS

BLOCKED = [arg.removeprefix("no:") for arg in INNER_SESSION_ARGS[1::2]]


def _installed(plugin: str) -> bool:
    return any(ep.name == plugin for ep in entry_points(group="pytest11"))


@pytest.mark.parametrize("blocked", BLOCKED)
def test_a_pytester_session_does_not_load_an_unused_plugin(pytester, blocked):
    if not _installed(blocked):
        pytest.skip(f"{blocked}'s pytest plugin is not installed here")
    pytester.makepyfile(test_one="""
        def test_plugins(pytestconfig):
            loaded = [name for name, plugin in pytestconfig.pluginmanager.list_name_plugin()
                      if plugin is not None]  # a blocked plugin is listed with None
            print("PLUGINS", sorted(n for n in loaded if n and "/" not in n))
        """)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    line = next(li for li in result.outlines if "PLUGINS" in li)
    assert f"'{blocked}'" not in line
    assert os.environ["PYTEST_ADDOPTS"].split()[-len(INNER_SESSION_ARGS):] == \
        list(INNER_SESSION_ARGS)


def test_a_command_started_session_gets_the_same_options(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os\n\ndef test_env():\n    print('ADDOPTS', os.environ['PYTEST_ADDOPTS'])\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
                           str(probe)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " ".join(INNER_SESSION_ARGS) in done.stdout
