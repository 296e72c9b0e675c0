"""A rank's exit code is decided once (harness.contracts.rank_exit), for `python -m harness.trainer`
and the zygote's forked ranks alike."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.contracts.rank_exit import FAILURES_ENV, exit_code, first_failed_rank


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
    code = ("import sys\nfrom harness.contracts.rank_exit import end\n"
            f"def main():\n    {body}\nend(main)\nprint('after end')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == returncode, done.stderr
    assert err in done.stderr and "after end" not in done.stdout
    assert ("last words" in done.stdout) == (returncode == 7)


def test_a_rank_that_raises_records_when_and_what(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAILURES_ENV, str(tmp_path / "failures"))
    monkeypatch.setenv("RANK", "3")
    assert exit_code(_raises(RuntimeError("planted crash on rank 3"))) == 1
    monkeypatch.setenv("RANK", "1")
    assert exit_code(_raises(SystemExit(2))) == 2  # an exit is no failure to order
    import json
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "failures").iterdir()]
    assert record["rank"] == 3 and record["error"] == "RuntimeError: planted crash on rank 3"
    assert first_failed_rank(tmp_path / "failures") == 3
    (tmp_path / "failures" / "rank0.json").write_text(json.dumps(
        {"rank": 0, "time": record["time"] + 0.002, "error": "peer closed"}))
    (tmp_path / "failures" / "rank5.json").write_text("{")  # unreadable: left out
    assert first_failed_rank(tmp_path / "failures") == 3
    assert first_failed_rank(tmp_path / "failures", named=0) == 3  # 0 raised later
    assert first_failed_rank(tmp_path / "failures", named=7) == 7  # no record: by a signal
    assert first_failed_rank(tmp_path / "nowhere") is None
    assert first_failed_rank(tmp_path / "nowhere", named=2) == 2
