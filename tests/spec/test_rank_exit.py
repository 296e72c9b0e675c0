"""A rank's exit code is decided once (harness.spec.rank_exit), for `python -m harness.trainer`
and the zygote's forked ranks alike."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.spec.rank_exit import exit_code


def _raises(error):
    def main():
        raise error
    return main


@pytest.mark.parametrize("main, expected", [
    (lambda: None, 0), (lambda: 0, 0), (lambda: 3, 3), (lambda: 256, 1), (lambda: -1, 1),
    (_raises(SystemExit()), 0), (_raises(SystemExit(2)), 2), (_raises(SystemExit(300)), 1),
    (_raises(RuntimeError("boom")), 1),
])
def test_the_exit_code_of_each_way_main_can_end(main, expected):
    assert exit_code(main) == expected


def test_a_message_in_system_exit_is_printed_and_gives_1(capsys):
    assert exit_code(_raises(SystemExit("--tensor_parallel 3 does not divide 4 heads"))) == 1
    assert capsys.readouterr().err == "--tensor_parallel 3 does not divide 4 heads\n"


def test_an_exception_prints_its_traceback(capsys):
    assert exit_code(_raises(ValueError("planted"))) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "ValueError: planted" in err


@pytest.mark.parametrize("body, returncode, err", [
    ("raise KeyboardInterrupt", -2, "KeyboardInterrupt"),  # by SIGINT, as a plain interpreter
    ("print('last words', flush=False); return 7", 7, ""),   # flushed before os._exit
])
def test_the_process_ends_with_its_code_or_signal(body, returncode, err):
    code = ("import sys\nfrom harness.spec.rank_exit import end\n"
            f"def main():\n    {body}\nend(main)\nprint('after end')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == returncode, done.stderr
    assert err in done.stderr and "after end" not in done.stdout
    assert ("last words" in done.stdout) == (returncode == 7)
