"""The history's rows cache (`history.rows.cache`, harness.history.store) is keyed on everything
its rows depend on (issue 48), and a session's append on each row's whole key:

- a cache is taken only when it was written in this cache format, by this Python, with this
  marshal version and this field order, for a file that still begins with the bytes it read: a
  cache written otherwise (here by a copy of harness.history.store loaded under another
  environment, its rows marked so they are told apart) is a miss, and the file is read whole;
  written the same way, it is a hit;
- a row is one night of one case by (session, date, case): an append of a row that differs in
  only one of them is appended, with the cache (its keys taken from it) and without it; the
  same row again is not; a history read keeps both.

Planted by hand, each failing a test of this file (issue 48): every part of _CACHE_FORMAT left
out (store.py), the file's digest left out of the check, and each of session, date and name
left out of a row's key (rows.py HistoryRow.key, store.py's keys of an append)."""

from __future__ import annotations

import dataclasses
import json
import marshal
import sys
import types
from pathlib import Path

import pytest

from harness.history import rows as rows_module
from harness.history import store
from harness.history.store import CACHE, append_rows, history_path, read_history

from .nights import night, row
from .test_store import _cold  # the history as read with no cache

MARK = "served from the other cache"
TAG = "harness.history-cache/1"  # the cache format's own tag, as store.py writes it


def _another_store(source: str, patched) -> types.ModuleType:
    """harness.history.store loaded again from `source`, as another version of the harness (or
    the harness under another Python) would run it; its cache's rows marked with MARK."""
    module = types.ModuleType("harness.history._another_store")
    module.__package__ = "harness.history"
    module.__file__ = store.__file__
    patched.setitem(sys.modules, module.__name__, module)  # its dataclasses look it up
    exec(compile(source, store.__file__, "exec"), module.__dict__)
    write = module._write_cache

    def marked(path, data, rows, added, segments):
        write(path, data, [dataclasses.replace(r, reason=MARK) for r in rows], added, segments)

    module._write_cache = marked
    return module


def _written_by_another(path: Path, monkeypatch, part: str | None) -> None:
    """The cache of `path` written by a store that differs from this one in `part` (None: in
    nothing but the mark on its rows)."""
    source = Path(store.__file__).read_text()
    with monkeypatch.context() as patched:
        if part == "format-tag":
            assert source.count(f'"{TAG}"') == 1, \
                f"the cache format's tag {TAG!r} is not in store.py: left out of its key?"
            source = source.replace(f'"{TAG}"', '"harness.history-cache/0"')
        elif part == "python-version":
            major, minor = sys.version_info[:2]
            patched.setattr(sys, "version_info", (major, minor + 1, 0, "final", 0))
        elif part == "marshal-version":
            patched.setattr(marshal, "version", marshal.version - 1)
        elif part == "field-order":  # its rows' values in another order
            patched.setattr(rows_module, "FIELD_ORDER", tuple(reversed(rows_module.FIELD_ORDER)))
        other = _another_store(source, patched)
        if part == "python-version":  # its format made; this Python's own for the rest
            patched.undo()
        path.with_name(CACHE).unlink(missing_ok=True)
        other.read_history(path)  # writes its cache
        assert path.with_name(CACHE).is_file()
        assert [r.reason for r in other.read_history(path).rows] == [MARK] * 3  # and takes it


def _history(tmp_path: Path) -> Path:
    path = history_path(tmp_path)
    append_rows(path, [row(i, name=f"basic/gpt2/c{i}") for i in range(3)])
    return path


CACHE_PARTS = ("format-tag", "python-version", "marshal-version", "field-order")


@pytest.mark.parametrize("part", CACHE_PARTS)
def test_a_cache_written_with_one_part_of_its_format_changed_is_a_miss(tmp_path, monkeypatch,
                                                                       part):
    path = _history(tmp_path)
    _written_by_another(path, monkeypatch, part)
    rows = read_history(path).rows
    assert MARK not in [r.reason for r in rows], \
        f"{part}: a cache of another {part} was taken: the cache's key leaves it out"
    assert rows == [row(i, name=f"basic/gpt2/c{i}") for i in range(3)] == _cold(path), part


def test_a_cache_written_the_same_way_is_a_hit(tmp_path, monkeypatch):
    """The control of the test above: the marked cache of an unchanged store is taken."""
    path = _history(tmp_path)
    _written_by_another(path, monkeypatch, None)
    assert [r.reason for r in read_history(path).rows] == [MARK] * 3


@pytest.mark.parametrize("change", ("same-length-edit", "shortened", "replaced"))
def test_a_cache_of_other_file_content_is_a_miss(tmp_path, monkeypatch, change):
    path = _history(tmp_path)
    _written_by_another(path, monkeypatch, None)  # a hit, until the file changes
    text = path.read_text()
    if change == "same-length-edit":
        edited = text.replace('"passed"', '"failed"', 1)
    elif change == "shortened":
        edited = "".join(text.splitlines(keepends=True)[:2])
    else:  # another history of the same length and line count
        edited = text.replace("night-00", "night-10")
    assert edited != text
    path.write_text(edited)
    rows = read_history(path).rows
    assert MARK not in [r.reason for r in rows], \
        f"{change}: the cache of another file's content was taken: its digest is left out"
    assert rows == _cold(path) and len(rows) == (2 if change == "shortened" else 3)


# ---------------------------------------------------------------- a row's key, in an append

ONE = row(1, name="basic/gpt2/pp2")
ROW_PARTS = {
    "session": dataclasses.replace(ONE, session="night-901"),
    "date": dataclasses.replace(ONE, date=night(2)),
    "name": dataclasses.replace(ONE, name="basic/gpt2/tp2"),
}


@pytest.mark.parametrize("cached", (True, False), ids=("cached", "uncached"))
@pytest.mark.parametrize("part", sorted(ROW_PARTS))
def test_a_row_that_differs_in_one_part_of_its_key_is_appended(tmp_path, part, cached):
    path = history_path(tmp_path)
    assert append_rows(path, [ONE]) == 1
    if cached:  # the append takes the keys the cache holds
        read_history(path)
        assert path.with_name(CACHE).is_file()
    other = ROW_PARTS[part]
    assert append_rows(path, [other]) == 1, \
        f"{part}: a row of another {part} counted as one the history holds: the key leaves it out"
    assert append_rows(path, [ONE, other]) == 0, part  # both held now
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line[part] for line in lines] == [getattr(ONE, part), getattr(other, part)]
    assert read_history(path).rows == sorted([ONE, other], key=store._order) == _cold(path)


@pytest.mark.parametrize("cached", (True, False), ids=("cached", "uncached"))
def test_the_same_row_again_is_not_appended(tmp_path, cached):
    path = history_path(tmp_path)
    append_rows(path, [ONE, row(2)])
    if cached:
        read_history(path)
    # the same key, other values: the night is held already (its first line kept)
    assert append_rows(path, [dataclasses.replace(ONE, status="failed"), row(2)]) == 0
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.parametrize("part", sorted(ROW_PARTS))
def test_a_read_keeps_rows_that_differ_in_one_part_of_their_key(tmp_path, part):
    path = history_path(tmp_path)
    path.parent.mkdir(parents=True)
    other = ROW_PARTS[part]
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in (ONE, other)))
    rows = read_history(path).rows
    assert len(rows) == 2, f"{part}: two rows of another {part} read as one night"
    assert read_history(path).rows == rows == _cold(path)  # from the cache as well
