"""`python -m harness.history` over an output folder of nights, and the nightly report's "Since
last week": tables newest first, when a case last changed status, the plots, the CSV, the
findings named with night and build; nothing said when nothing changed."""

from __future__ import annotations

import csv

import pytest

from harness.history.cli import main as history_main
from harness.report.cli import main as report_main

from .nights import record, write_session

QUIET = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0, 1008.0, 992.0, 1003.0, 997.0]


def nights(out, n=12, *, step_from=None, broken_from=None, config="configs/a.json"):
    """n nights of two cases; from night `step_from` pp2 runs 10% slower, from night
    `broken_from` (a new build) tp2 fails."""
    folders = []
    for i in range(n):
        tokens = QUIET[i % len(QUIET)] * (0.9 if step_from is not None and i >= step_from
                                          else 1.0)
        broken = broken_from is not None and i >= broken_from
        folders.append(write_session(out, i, [
            record("basic/gpt2/pp2", tokens=tokens),
            record("basic/gpt2/tp2", "failed" if broken else "passed",
                   reason="loss differs at step 2" if broken else None)],
            commit=("b" if broken else "a") * 40, config=config))
    return folders


def test_history_md_has_a_table_per_case_newest_first_with_plots_and_findings(tmp_path,
                                                                               capsys):
    out = tmp_path / "out"
    nights(out, step_from=9, broken_from=10)
    assert history_main([str(out), "--csv", str(tmp_path / "h.csv")]) == 0
    printed = capsys.readouterr().out
    assert "(12 sessions, 2 cases, 24 rows added from sessions; 2 findings, 2 since last week" \
        in printed
    text = (out / "history" / "history.md").read_text()
    assert (out / "history" / "history-basic-gpt2.png").stat().st_size > 1000
    assert "![basic / gpt2: tokens/s, peak memory and margins" in text
    table = text.split("### `basic/gpt2/pp2`")[1].split("###")[0]
    dates = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()
             if line.startswith("| 2026")]
    assert dates == sorted(dates, reverse=True) and len(dates) == 12  # newest first
    assert "Never changed status over 12 nights (passed)." in table
    tp2 = text.split("### `basic/gpt2/tp2`")[1]
    assert ("Last changed status on 2026-11-11 (session 20260010-021700-110, build bbbbbbb): "
            "passed → failed.") in tp2
    since = text.split("## Since last week")[1].split("## All findings")[0]
    assert "`basic/gpt2/pp2`: tokens/s fell 9.8% from 2026-11-10 (session " \
           "20260009-021700-109, build aaaaaaa)" in since
    assert "`basic/gpt2/tp2`: broke at build bbbbbbb: failed every night since 2026-11-11" \
        in since
    with open(tmp_path / "h.csv") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == 24
    assert rows[0]["case"] == "pp2" and rows[0]["date"] > rows[1]["date"]  # newest first
    assert {r["status"] for r in rows if r["case"] == "tp2"} == {"passed", "failed"}


def test_a_case_table_shows_its_newest_nights_and_says_how_many_are_left_out(tmp_path,
                                                                            capsys):
    """A year of 200 cases in full was 73,000 table lines (9.5 MB of markdown); a table shows
    the newest --nights (default 30), says how many are left out and where they are, and
    --nights 0 shows every one. Plant: the cap applied oldest first (`series[:n]`)."""
    out = tmp_path / "out"
    nights(out, n=12)
    assert history_main([str(out), "--no-plots", "--nights", "5"]) == 0
    table = (out / "history" / "history.md").read_text().split("### `basic/gpt2/pp2`")[1]
    table = table.split("###")[0]
    dates = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()
             if line.startswith("| 2026")]
    assert dates == ["2026-11-12 02:17", "2026-11-11 02:17", "2026-11-10 02:17",
                     "2026-11-09 02:17", "2026-11-08 02:17"]
    assert "7 older nights not shown (every night: `python -m harness.history DIR --csv " \
        "FILE`, or `--nights 0`)." in table
    assert history_main([str(out), "--no-plots", "--nights", "0"]) == 0
    text = (out / "history" / "history.md").read_text()
    assert "older nights not shown" not in text and text.count("| 2026-11-01") == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # a negative count: one line naming the flag
        history_main([str(out), "--nights", "-1"])
    assert refused.value.code == 2
    assert "--nights -1: expected 0 (every night) or more" in capsys.readouterr().err


def test_the_nightly_report_says_what_changed_since_last_week_and_nothing_otherwise(tmp_path,
                                                                                    capsys):
    out = tmp_path / "out"
    last = nights(out, step_from=9)[-1]
    assert history_main([str(out), "--no-plots"]) == 0
    assert report_main([str(last), "--no-plots", "-o", str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "## Since last week" in report
    assert "`basic/gpt2/pp2`: tokens/s fell 9.8% from 2026-11-10" in report

    quiet = tmp_path / "quiet"
    last = nights(quiet)[-1]
    assert history_main([str(quiet), "--no-plots"]) == 0
    assert report_main([str(last), "--no-plots", "-o", str(tmp_path / "q.md")]) == 0
    assert "Since last week" not in (tmp_path / "q.md").read_text()
    capsys.readouterr()
    assert report_main([str(last), "--no-plots", "-o", str(tmp_path / "q.md"),
                        "--history", str(tmp_path / "nowhere")]) == 2
    assert "--history " in capsys.readouterr().err


def test_sessions_of_another_config_are_kept_apart_and_said(tmp_path):
    out = tmp_path / "out"
    nights(out, n=8, config="configs/a.json")
    for i in range(8, 12):  # the other config runs slower: no step, another series
        write_session(out, i, [record("basic/gpt2/pp2", tokens=500.0)], config="other/b.json")
    assert history_main([str(out), "--no-plots"]) == 0
    text = (out / "history" / "history.md").read_text()
    assert ("This history holds sessions of 2 configs; each is kept apart (its own tables and "
            "series): `configs/a.json`, `other/b.json`.") in text
    assert "## Config `configs/a.json`" in text and "## Config `other/b.json`" in text
    assert "fell" not in text


def test_a_run_folder_imports_beside_the_sessions_and_a_bad_folder_is_one_line(tmp_path,
                                                                               capsys):
    from .test_run_folders import write_log

    out = tmp_path / "out"
    nights(out, n=3)
    run = tmp_path / "runs" / "a800" / "20251127" / "master_e7d57db"
    write_log(run / "logs" / "gpt2_1.log")
    assert history_main([str(out), "--no-plots", "--import", str(tmp_path / "runs")]) == 0
    assert "imported 1 run (0 already in the history)" in capsys.readouterr().out
    text = (out / "history" / "history.md").read_text()
    assert "## Config `InfiniTrain run folders`" in text and "`untagged/gpt2/1`" in text
    assert history_main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"harness.history: {tmp_path / 'missing'}: no such folder; expected an "
                   "output folder (holding sessions/), e.g. the pytest run's --harness-output"]
