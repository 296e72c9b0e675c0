"""The history file: rows typed and validated, appends idempotent, sessions of the output folder
synced in, bad lines kept aside and the rest read, copies and other configs told apart."""

from __future__ import annotations

import json

import pytest

from harness.history.rows import HistoryRow
from harness.history.store import (CACHE, REJECTED, append_rows, append_session, history_path,
                                   read_history, sync)

from .nights import record, row, write_session


def test_a_row_refuses_a_wrong_type_an_unknown_key_and_a_bad_status():
    with pytest.raises(ValueError, match=r"tokens_per_s = 'fast', expected float \| None"):
        row(0, tokens_per_s="fast")
    with pytest.raises(ValueError, match="status 'green', expected one of passed"):
        row(0, status="green")
    with pytest.raises(ValueError, match="name 'gpt2', expected tag/model/id"):
        row(0, name="gpt2")
    data = row(0).to_json()
    with pytest.raises(ValueError, match=r"h.jsonl:3: unknown key 'colour'"):
        HistoryRow.from_json({**data, "colour": "red"}, "h.jsonl:3")
    assert HistoryRow.from_json(data, "h.jsonl:1") == row(0)


def test_an_infinite_margin_round_trips_as_json():
    r = row(0, loss_margin=float("inf"))
    text = json.dumps(r.to_json(), allow_nan=False)  # JSON has no inf: written "inf"
    assert HistoryRow.from_json(json.loads(text), "x").loss_margin == float("inf")


def test_a_session_becomes_one_row_per_case_with_its_margins_and_machine(tmp_path):
    folder = write_session(tmp_path, 3, [
        record("basic/gpt2/pp2", tokens=2000.0, memory=417.0, loss_margin=923.0),
        record("basic/gpt2/tp2", "failed", reason="loss differs at step 2\nmore text")])
    line = append_session(folder, tmp_path)
    assert line.startswith("2 cases appended to ")
    rows = read_history(history_path(tmp_path)).rows
    by = {r.name: r for r in rows}
    assert by["basic/gpt2/pp2"].tokens_per_s == 2000.0
    assert by["basic/gpt2/pp2"].loss_margin == 923.0
    assert by["basic/gpt2/pp2"].gradient_margin == 150.0
    assert by["basic/gpt2/pp2"].last_loss == 5.3 and by["basic/gpt2/pp2"].last_step == 3
    assert by["basic/gpt2/pp2"].machine == "box" and by["basic/gpt2/pp2"].commit == "a" * 40
    assert by["basic/gpt2/pp2"].tokens_per_s_spread == pytest.approx(0.00577, rel=0.01)
    assert by["basic/gpt2/tp2"].reason == "loss differs at step 2"  # one line
    assert by["basic/gpt2/pp2"].reason is None


def test_appending_a_session_twice_records_it_once(tmp_path):
    folder = write_session(tmp_path, 1, [record("basic/gpt2/pp2")])
    append_session(folder, tmp_path)
    assert append_session(folder, tmp_path).startswith("0 cases appended")
    assert len(history_path(tmp_path).read_text().splitlines()) == 1


def test_a_deleted_history_is_rebuilt_from_the_session_folders(tmp_path):
    for i in range(3):
        append_session(write_session(tmp_path, i, [record("basic/gpt2/pp2")]), tmp_path)
    before = read_history(history_path(tmp_path)).rows
    history_path(tmp_path).unlink()
    added, notes = sync(tmp_path)
    assert (added, notes) == (3, [])
    assert read_history(history_path(tmp_path)).rows == before
    assert sync(tmp_path) == (0, [])  # nothing twice


def test_a_session_folder_copied_twice_is_read_once_and_said(tmp_path):
    folder = write_session(tmp_path, 1, [record("basic/gpt2/pp2")])
    copy = tmp_path / "sessions" / "zz-copy"
    copy.mkdir()
    for name in ("session.json", "results.jsonl"):
        (copy / name).write_text((folder / name).read_text())
    added, notes = sync(tmp_path)
    assert added == 1
    assert len(notes) == 1 and "zz-copy: a copy of session 20260001-021700-101" in notes[0]
    added, notes = sync(tmp_path)  # known now: still said, still once
    assert added == 0 and "a copy of session" in notes[0]
    assert len(read_history(history_path(tmp_path)).rows) == 1


def test_a_truncated_and_a_corrupt_line_are_kept_aside_and_the_rest_read(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(0), row(1)])
    good = path.read_text()
    path.write_text(good.splitlines()[0] + "\n{not json}\n" + good.splitlines()[1] + "\n"
                    + good.splitlines()[1][:40])  # a writer killed in the middle of a line
    history = read_history(path)
    assert [r.session for r in history.rows] == ["night-000", "night-001"]
    assert len(history.notes) == 2
    assert history.notes[0].startswith(f"{path}:2: not JSON")
    assert history.notes[1].startswith(f"{path}:4: truncated") and REJECTED in history.notes[1]
    rejected = [json.loads(x) for x in path.with_name(REJECTED).read_text().splitlines()]
    assert [r["text"] for r in rejected] == ["{not json}", good.splitlines()[1][:40]]  # not lost
    assert read_history(path).notes == []  # moved aside once, not reported every time


def test_an_append_after_a_cut_line_does_not_glue_onto_it(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(0)])
    path.write_text(path.read_text() + '{"session": "cut')
    append_rows(path, [row(1)])
    history = read_history(path)
    assert [r.session for r in history.rows] == ["night-000", "night-001"]
    assert "truncated" not in history.notes[0] and "not JSON" in history.notes[0]


def test_an_append_is_not_blocked_by_a_damaged_line_of_the_same_key(tmp_path):
    """An append reads only the keys of the lines (a year of nights at every session's finish),
    but a key is trusted only when its line is a row: a damaged line of the same session, date
    and case must not stop the real row from being recorded. Plant: append_rows taking every
    key as held (`if row.key not in keyed`)."""
    path = history_path(tmp_path)
    damaged = {**row(0).to_json(), "status": "exploded"}  # JSON, its key, but no row
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(damaged) + "\n")
    assert append_rows(path, [row(0)]) == 1
    assert append_rows(path, [row(0)]) == 0  # now held: not twice
    history = read_history(path)
    assert [r.status for r in history.rows] == ["passed"]
    assert "status 'exploded'" in history.notes[0]


def test_a_row_of_another_format_is_kept_aside_with_the_reason(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(0)])
    with open(path, "a") as stream:
        stream.write(json.dumps({**row(1).to_json(), "format": "harness.history/9"}) + "\n")
    history = read_history(path)
    assert len(history.rows) == 1
    assert "format 'harness.history/9', expected 'harness.history/1'" in history.notes[0]


def test_sessions_of_another_config_are_kept_apart(tmp_path):
    write_session(tmp_path, 1, [record("basic/gpt2/pp2")], config="configs/a.json")
    write_session(tmp_path, 2, [record("basic/gpt2/pp2")], config="other/b.json")
    sync(tmp_path)
    history = read_history(history_path(tmp_path))
    assert history.configs() == ["configs/a.json", "other/b.json"]


def _cold(path):
    """The history as read with no cache (what every cached read must equal)."""
    cache = path.with_name(CACHE)
    kept = cache.read_bytes() if cache.exists() else None
    cache.unlink(missing_ok=True)
    try:
        return read_history(path).rows
    finally:
        if kept is not None:
            cache.write_bytes(kept)


def test_a_second_read_takes_the_cached_rows_and_parses_only_the_new_lines(tmp_path, monkeypatch):
    path = history_path(tmp_path)
    append_rows(path, [row(i, name=f"basic/gpt2/c{c}") for i in range(4) for c in range(3)])
    first = read_history(path).rows
    assert path.with_name(CACHE).is_file()
    append_rows(path, [row(4, name="basic/gpt2/c0"), row(4, name="basic/gpt2/c1")])
    parsed = []
    real = HistoryRow.from_json.__func__
    monkeypatch.setattr(HistoryRow, "from_json", classmethod(
        lambda cls, data, where: parsed.append(where) or real(cls, data, where)))
    second = read_history(path).rows
    assert [w.rsplit(":", 1)[1] for w in parsed] == ["13", "14"]  # the two new lines only
    assert second == first + [row(4, name="basic/gpt2/c0"), row(4, name="basic/gpt2/c1")]
    monkeypatch.undo()
    assert second == _cold(path)


def test_an_append_takes_the_cached_keys_and_parses_only_the_lines_after_them(
        tmp_path, monkeypatch):
    """A session's finish appends to a history of every night: the keys the cache holds are
    taken from it, only the lines after it are parsed. Plants: the whole file scanned for
    keys (the scan sees 14 lines, not 2); the cache's keys ignored (its rows written again)."""
    from harness.history import store

    path = history_path(tmp_path)
    append_rows(path, [row(i, name=f"basic/gpt2/c{c}") for i in range(4) for c in range(3)])
    read_history(path)  # the cache holds these 12 rows
    append_rows(path, [row(4, name="basic/gpt2/c0"), row(4, name="basic/gpt2/c1")])
    scanned = []
    real = store.scan_jsonl_text
    monkeypatch.setattr(store, "scan_jsonl_text", lambda raw, first=1: scanned.append(
        (first, raw.count("\n"))) or real(raw, first))
    # a session appended again (rows in the cache and after it), and one new night
    added = append_rows(path, [row(0, name="basic/gpt2/c0"), row(3, name="basic/gpt2/c2"),
                               row(4, name="basic/gpt2/c1"), row(5, name="basic/gpt2/c0")])
    assert added == 1
    assert scanned == [(13, 2)]  # from line 13, the two lines after the cache
    monkeypatch.undo()
    lines = path.read_text().splitlines()
    assert len(lines) == 15 and json.loads(lines[-1])["session"] == "night-005"
    # with no cache (deleted, or a history rewritten) every line is scanned, and still once
    path.with_name(CACHE).unlink()
    assert append_rows(path, [row(0, name="basic/gpt2/c0"), row(5, name="basic/gpt2/c0")]) == 0


def test_an_older_night_and_a_repeated_key_after_the_cache_keep_the_order_and_one_row(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(i) for i in (1, 2, 3)])
    read_history(path)  # the cache holds nights 1-3
    with open(path, "a") as stream:  # night 0 imported late, and night 2 written again
        stream.write(json.dumps(row(0).to_json()) + "\n")
        stream.write(json.dumps(row(2, status="failed").to_json()) + "\n")
    rows = read_history(path).rows
    assert rows == [row(0), row(1), row(2), row(3)]  # the first line of night 2 kept
    assert rows == _cold(path)


def test_a_rewritten_history_or_a_broken_cache_is_read_whole(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(i) for i in range(3)])
    read_history(path)
    # the same length, one value changed inside what the cache holds: its digest misses
    text = path.read_text()
    path.write_text(text.replace('"passed"', '"failed"', 1))
    assert read_history(path).rows[0].status == "failed"
    for junk in (b"", b"\x00garbage", path.with_name(CACHE).read_bytes()[:100]):
        path.with_name(CACHE).write_bytes(junk)
        assert read_history(path).rows == _cold(path)
    # shortened below what the cache covers
    read_history(path)
    path.write_text("".join(text.splitlines(keepends=True)[:1]))
    assert [r.date for r in read_history(path).rows] == [row(0).date]


def test_a_bad_line_after_the_cache_is_kept_aside_and_the_cache_still_serves(tmp_path):
    path = history_path(tmp_path)
    append_rows(path, [row(i) for i in range(2)])
    read_history(path)
    with open(path, "a") as stream:
        stream.write('{"session": "cut\n')
    history = read_history(path)
    assert history.rows == [row(0), row(1)]
    assert any(":3: " in note and REJECTED in note for note in history.notes)
    append_rows(path, [row(2)])
    assert read_history(path).rows == [row(0), row(1), row(2)] == _cold(path)


def _segment_count(path):
    from harness.history.store import _segments

    segments, whole = _segments(path.with_name(CACHE).read_bytes())
    return len(segments), whole


def test_each_nightly_adds_one_segment_to_the_cache_and_a_broken_end_rewrites_it(
        tmp_path, monkeypatch):
    import harness.history.store as store

    path = history_path(tmp_path)
    append_rows(path, [row(0), row(1)])
    read_history(path)
    for night in (2, 3):
        append_rows(path, [row(night)])
        assert read_history(path).rows == _cold(path)
    assert _segment_count(path) == (3, True)  # the first read's rows, then one night each
    # a reader killed while adding its segment: what reads whole still serves, and the next
    # write starts the cache over (nothing is added behind the broken bytes)
    with open(path.with_name(CACHE), "ab") as stream:
        stream.write((1000).to_bytes(8, "little") + b"cut")
    append_rows(path, [row(4)])
    assert read_history(path).rows == [row(i) for i in range(5)] == _cold(path)
    assert _segment_count(path) == (1, True)
    # past MAX_SEGMENTS the cache is written whole again
    monkeypatch.setattr(store, "MAX_SEGMENTS", 2)
    for night in (5, 6):
        append_rows(path, [row(night)])
        read_history(path)
    assert _segment_count(path) == (1, True)
    assert read_history(path).rows == [row(i) for i in range(7)] == _cold(path)
