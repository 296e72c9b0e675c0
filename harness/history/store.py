"""The history file: `<output>/history/history.jsonl` beside the output folder's `sessions/`, one
HistoryRow per line, every session's cases appended at its finish.

Safe under concurrent sessions: every write holds the file's lock (`history.jsonl.lock`,
filelock), and a session's rows go in as one write. Under pytest-xdist only the controller
appends (its workers share its session). Appending is idempotent: a row whose key (session,
date, case) is there already is not written again, so a session appended twice, or a session
folder copied under another name, counts once.

Rebuildable from the session folders: `sync` appends every session under `<output>/sessions/`
that the history lacks (history.jsonl deleted: all of them), and `python -m harness.history`
runs it first.

Nothing recorded is lost to a bad line: a line that is not a row (cut short by a killed
writer, edited by hand) is moved, under the lock, to `history.rejected.jsonl` beside it, said
in one line naming the file and line, and the rest is read.

Read fast, night after night: parsing and validating a year of 200 cases (73,000 lines, 47 MiB)
takes seconds, and a nightly adds one night. So a reader leaves the rows it read in
`history.rows.cache` beside the file (marshal: plain tuples, this Python's format), with the
length of the file they came from and its SHA-1. The next reader takes those rows when the
file still begins with exactly those bytes, and parses only the lines after them; the rows it
adds go on the end of the cache as one more segment (a nightly writes one night, not the
year), and every MAX_SEGMENTS the cache is written whole again. Anything else (another
Python, a file rewritten or shortened) is a miss: the whole file is read, as without a cache;
a segment cut short is left off. An append takes the keys of the cached rows and parses only the
lines after them too. The cache is derived, never the record: deleting it loses nothing.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shlex
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from harness.results.reading import read_session
from harness.results.session import HEADER_NAME, read_header
from harness.contracts.records import RESULTS_NAME, scan_jsonl, scan_jsonl_text, write_atomic

from .rows import FIELD_ORDER, HistoryRow, session_rows

FOLDER = "history"
FILE = "history.jsonl"
REJECTED = "history.rejected.jsonl"
CACHE = "history.rows.cache"
MAX_SEGMENTS = 64  # a cache of more is written whole again (one segment), not added to
# What a cache must say it is to be read: its own format, this Python's marshal, the rows'.
_CACHE_FORMAT = ("harness.history-cache/1", tuple(sys.version_info[:2]), marshal.version,
                 FIELD_ORDER)


def history_path(output: str | os.PathLike) -> Path:
    return Path(output) / FOLDER / FILE


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def when(row: HistoryRow) -> datetime:
    """The row's date as an aware time (no zone given: UTC; an unreadable date sorts first)."""
    return moment(row.date)


@lru_cache(maxsize=4096)  # one date per session: a year of 200 cases parses 365, not 73,000
def moment(date: str) -> datetime:
    """A row's date string as an aware time (see `when`)."""
    try:
        parsed = datetime.fromisoformat(date)
    except ValueError:
        try:
            parsed = datetime.strptime(date, "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return _NEVER
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


@dataclass
class History:
    path: Path
    rows: list[HistoryRow] = field(default_factory=list)  # oldest first
    notes: list[str] = field(default_factory=list)  # one line each: what was kept aside, ...

    def configs(self) -> list[str]:
        return sorted({r.config for r in self.rows})


def _lock(path: Path) -> FileLock:
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock")


def _order(row: HistoryRow) -> tuple:
    return when(row), row.session, row.name


def _segments(raw: bytes) -> tuple[list[tuple], bool]:
    """The cache's segments (each 8 bytes of length, then its marshal), and whether the file
    is exactly them (a segment cut short by a killed reader, or junk, is not)."""
    segments, at = [], 0
    while at + 8 <= len(raw):
        size = int.from_bytes(raw[at:at + 8], "little")
        body = raw[at + 8:at + 8 + size]
        if len(body) < size:
            return segments, False
        try:
            segment = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            return segments, False
        if not (isinstance(segment, tuple) and len(segment) == 5
                and segment[0] == _CACHE_FORMAT):
            return segments, False
        segments.append(segment)
        at += 8 + size
    return segments, at == len(raw)


def _cached_values(path: Path, data: bytes) -> tuple[list[tuple], int, int, int]:
    """(rows as values(), bytes, lines, segments to add to) of the file's beginning that its
    cache holds, the rows oldest first and each key once; none on any miss. The cache is a run
    of segments, each the rows one reader added, with the length and digest of the file they
    bring it to: the last segment is checked against the file. A cache with a broken end
    still serves what reads whole before it, and is then written whole again (0 segments to
    add to)."""
    try:
        segments, whole = _segments(path.with_name(CACHE).read_bytes())
    except OSError:  # none yet
        return [], 0, 0, 0
    if not segments:
        return [], 0, 0, 0
    _, length, digest, lines, _ = segments[-1]
    if length > len(data) or hashlib.sha1(data[:length]).hexdigest() != digest:
        return [], 0, 0, 0
    return ([v for segment in segments for v in segment[4]], length, lines,
            len(segments) if whole else 0)


def _cached(path: Path, data: bytes) -> tuple[list[HistoryRow], int, int, int]:
    """_cached_values, as rows."""
    values, length, lines, segments = _cached_values(path, data)
    return [HistoryRow.trusted(v) for v in values], length, lines, segments


def _write_cache(path: Path, data: bytes, rows: list[HistoryRow], added: int,
                 segments: int) -> None:
    """For the next reader: the `added` newest rows as one more segment of the cache, or, when
    there is no cache to add to (or it has MAX_SEGMENTS), every row as its first. None for a
    file ending in a cut line."""
    if not data.endswith(b"\n"):
        return
    whole = not segments or segments >= MAX_SEGMENTS
    body = marshal.dumps((_CACHE_FORMAT, len(data), hashlib.sha1(data).hexdigest(),
                          data.count(b"\n"),
                          [r.values() for r in (rows if whole else rows[len(rows) - added:])]))
    segment = len(body).to_bytes(8, "little") + body
    try:
        if whole:
            write_atomic(path.with_name(CACHE), segment)
        else:  # under the history's lock: one appender at a time
            with open(path.with_name(CACHE), "ab") as stream:
                stream.write(segment)
    except OSError:  # a read-only history is read, just not faster next time
        pass


def _read_unlocked(path: Path) -> tuple[list[HistoryRow], list[tuple[int, str, str]]]:
    """(rows oldest first, each key once (its first line); bad lines as (number, text,
    problem)): the cache's rows, then the lines after them."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    rows, start, lines_before, segments = _cached(path, data)
    bad, new = [], []
    tail = data[start:]
    for line in scan_jsonl_text(tail.decode("utf-8", errors="replace"), lines_before + 1):
        if line.problem:
            bad.append((line.number, line.text, line.problem))
            continue
        try:
            new.append(HistoryRow.from_json(line.value, f"{path}:{line.number}"))
        except ValueError as error:
            bad.append((line.number, line.text, str(error).split(": ", 1)[-1]))
    seen = {r.key for r in rows} if new else set()
    fresh = []
    for row in new:
        if row.key not in seen:
            seen.add(row.key)
            fresh.append(row)
    fresh.sort(key=_order)
    # a nightly's rows are the newest: appended (and so a segment of the cache); an older
    # night imported: sorted in, and the cache written whole
    in_order = not rows or not fresh or _order(rows[-1]) <= _order(fresh[0])
    rows += fresh
    if not in_order:
        rows.sort(key=_order)
    if tail.strip() and not bad:  # the next reader starts after these lines
        _write_cache(path, data, rows, len(fresh), segments if in_order else 0)
    return rows, bad


_KEY_AT = tuple(FIELD_ORDER.index(name) for name in ("session", "date", "name"))


def _keyed_unlocked(path: Path) -> tuple[set[tuple], dict[tuple, list[dict]]]:
    """What an append needs, at every session's finish, of a history of every night: the keys
    (session, date, case) of the rows the cache holds (each a row: only a reader that
    validated it wrote it), and each line after them that could be a row by its key, without
    building the rows. A key of the lines is trusted only once its line is checked to be a
    row (`_is_row`), for the few keys a caller asks about; a line that is no row is kept aside
    by read_history, not here. A nightly's append so reads the cache and parses one night,
    not the year."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set(), {}
    values, start, lines_before, _ = _cached_values(path, data)
    session, date, name = _KEY_AT
    held = {(v[session], v[date], v[name]) for v in values}
    keyed: dict[tuple, list[dict]] = {}
    tail = data[start:].decode("utf-8", errors="replace")
    for line in scan_jsonl_text(tail, lines_before + 1):
        value = line.value
        if isinstance(value, dict):
            key = (value.get("session"), value.get("date"), value.get("name"))
            keyed.setdefault(key, []).append(value)
    return held, keyed


def _is_row(values: list[dict]) -> bool:
    """Whether one of these lines' values is a valid row (a row the history holds)."""
    for value in values:
        try:
            HistoryRow.from_json(value, "")
            return True
        except ValueError:
            continue
    return False


def read_history(path: str | os.PathLike) -> History:
    """Every row, oldest first, each key once; bad lines moved aside (and said)."""
    path = Path(path)
    history = History(path)
    if not path.exists():
        return history
    with _lock(path):
        rows, bad = _read_unlocked(path)
        if bad:
            _keep_aside(path, bad)
    rejected = path.with_name(REJECTED)
    for number, _text, problem in bad:
        history.notes.append(f"{path}:{number}: {problem}; kept aside in {rejected}")
    history.rows = rows
    return history


def _keep_aside(path: Path, bad: list[tuple[int, str, str]]) -> None:
    """Under the lock: the bad lines appended to the rejected file, the history rewritten
    without them (rejected first, so a crash between the two loses nothing)."""
    numbers = {number for number, _, _ in bad}
    with open(path.with_name(REJECTED), "a") as stream:
        for number, text, problem in bad:
            stream.write(json.dumps({"line": number, "problem": problem, "text": text}) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    kept = [line.text for line in scan_jsonl(path) if line.number not in numbers]
    write_atomic(path, "".join(text + "\n" for text in kept))


def append_rows(path: str | os.PathLike, rows: list[HistoryRow]) -> int:
    """Append the rows the history does not hold yet, as one write under the lock; how many
    were new."""
    path = Path(path)
    with _lock(path):
        held, keyed = _keyed_unlocked(path)
        new = []
        for row in rows:
            if row.key in held:
                continue
            if row.key not in keyed or not _is_row(keyed[row.key]):
                keyed[row.key] = [row.to_json()]
                new.append(row)
        if not new:
            return 0
        text = "".join(json.dumps(r.to_json(), allow_nan=False) + "\n" for r in new)
        with open(path, "ab+") as stream:
            stream.seek(0, os.SEEK_END)
            if stream.tell():  # a line cut short by a killed writer stays a line of its own
                stream.seek(-1, os.SEEK_END)
                if stream.read(1) != b"\n":
                    text = "\n" + text
            stream.write(text.encode())
            stream.flush()
            os.fsync(stream.fileno())
    return len(new)


def read_session_rows(folder: Path) -> tuple[list[HistoryRow], list[str]]:
    """A session folder's rows, and one line per problem (unreadable result lines)."""
    session = read_session([folder / RESULTS_NAME])
    notes = [f"{b.path}:{b.number}: {b.problem}; not in the history" for b in session.bad_lines]
    return session_rows(session.header, session.records, folder), notes


def append_session(folder: str | os.PathLike, output: str | os.PathLike) -> str:
    """At a session's finish: its cases into the output folder's history; the summary's line
    (how many rows, where, and the command that renders it)."""
    rows, _ = read_session_rows(Path(folder))
    path = history_path(output)
    added = append_rows(path, rows)
    return (f"{added} case{'' if added == 1 else 's'} appended to {path} "
            f"(python -m harness.history {shlex.quote(str(Path(output)))})")


def session_folders(output: Path) -> list[Path]:
    sessions = output / "sessions"
    if not sessions.is_dir():
        return []
    return sorted(p for p in sessions.iterdir()
                  if (p / RESULTS_NAME).is_file() or (p / HEADER_NAME).is_file())


def sync(output: str | os.PathLike, history: History | None = None) -> tuple[int, list[str]]:
    """Append every session under `<output>/sessions/` the history lacks: (rows added, one line
    per thing said: a folder that is a copy of another session, unreadable lines). `history`:
    the history as just read (read_history), when the caller has it: its sessions are known."""
    output = Path(output)
    path = history_path(output)
    notes: list[str] = []
    if history is None:
        history = read_history(path)
    known = {(r.session, r.date) for r in history.rows}
    first_folder: dict[tuple[str, str], Path] = {}
    rows: list[HistoryRow] = []
    for folder in session_folders(output):
        header = read_header(folder) or {}
        seen = (str(header.get("session")), str(header.get("started_at")))
        if seen in known:  # appended at its finish already: not read again
            if seen in first_folder:
                notes.append(f"{folder}: a copy of session {seen[0]} (also in "
                             f"{first_folder[seen]}); read once")
            first_folder.setdefault(seen, folder)
            continue
        found, problems = read_session_rows(folder)
        notes += problems
        for key in sorted({(r.session, r.date) for r in found}):
            if key in first_folder:
                notes.append(f"{folder}: a copy of session {key[0]} (also in "
                             f"{first_folder[key]}); read once")
            else:
                first_folder[key] = folder
        rows += [r for r in found if (r.session, r.date) not in known]
    return append_rows(path, rows) if rows else 0, notes
