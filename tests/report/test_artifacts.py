"""Failing cases' folders are copied for upload, without their gradient dumps."""

from __future__ import annotations

from harness.report.artifacts import copy_failing, main

from .records import case, diverged, write


def test_only_failing_cases_are_copied_and_gradients_are_left_behind(tmp_path, capsys):
    session = tmp_path / "sessions" / "s1"
    records = []
    for case_id, failed in (("ok", False), ("bad", True)):
        out = session / "cases" / "t" / "gpt2" / case_id
        (out / "logs" / "ranks").mkdir(parents=True)
        (out / "logs" / "ranks" / "1.log").write_text("Traceback\n")
        (out / "gradients").mkdir()
        (out / "gradients" / "wte.weight.npy").write_bytes(b"\0" * 64)
        record = case("t", "gpt2", case_id, output_dir=str(out))
        records.append(diverged(record) if failed else record)
    results = write(session / "results.jsonl", records)

    copies = copy_failing(results, tmp_path / "upload")

    assert copies == [tmp_path / "upload" / "cases" / "t" / "gpt2" / "bad"]
    assert (copies[0] / "logs" / "ranks" / "1.log").read_text() == "Traceback\n"
    assert not (copies[0] / "gradients").exists()
    assert main([str(session), str(tmp_path / "again")]) == 0
    assert "copied 1 failing case folder(s)" in capsys.readouterr().out
