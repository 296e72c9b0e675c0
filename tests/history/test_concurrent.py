"""The history under concurrent writers: sessions finishing at once (two nightlies sharing an
output folder, the same session appended by two processes) lose no line, glue no two lines
together and record a row once."""

from __future__ import annotations

import json
import multiprocessing

from harness.history.store import append_rows, history_path, read_history
from tests.history.nights import row

WRITERS = 4
NIGHTS = 10  # per writer


def _append_nights(output: str, writer: int, start: multiprocessing.Event) -> None:
    start.wait(30)
    for i in range(NIGHTS):
        # Each writer's own nights, one append each, and night 0 of writer 0 by everyone: the
        # same rows offered four times at once must be recorded once.
        append_rows(history_path(output), [row(writer * 1000 + i, name="basic/gpt2/pp2"),
                                           row(writer * 1000 + i, name="basic/gpt2/single")])
        append_rows(history_path(output), [row(0, name="basic/gpt2/pp2")])


def test_concurrent_writers_lose_nothing_and_record_each_row_once(tmp_path):
    history_path(tmp_path).parent.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [context.Process(target=_append_nights, args=(str(tmp_path), w, start))
               for w in range(WRITERS)]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(120)
    assert [p.exitcode for p in writers] == [0] * WRITERS

    lines = history_path(tmp_path).read_text().splitlines()
    assert all(json.loads(line)["format"] for line in lines)  # no two lines glued together
    history = read_history(history_path(tmp_path))
    assert history.notes == []
    keys = [r.key for r in history.rows]
    assert len(keys) == len(set(keys)) == WRITERS * NIGHTS * 2
    expected = {(f"night-{w * 1000 + i:03d}", name) for w in range(WRITERS)
                for i in range(NIGHTS) for name in ("basic/gpt2/pp2", "basic/gpt2/single")}
    assert {(r.session, r.name) for r in history.rows} == expected
