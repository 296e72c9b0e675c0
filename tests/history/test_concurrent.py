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


# The figures drawn in forked workers (drawing.Drawers), run in a fresh single-threaded
# interpreter as the CLI is (fork() from this test's process, which may hold threads, is not
# what the CLI does): every worker is ended and reaped when the figures are done, when a
# figure fails and when the caller's own work fails, checked by its pid.
_DRAW = r"""
import json, multiprocessing, os, sys
from pathlib import Path
from harness.history.drawing import Drawers, case_points
from tests.history.nights import row

out = Path(sys.argv[1])
cases = {f"basic/gpt2/c{c}": case_points([row(i, name=f"basic/gpt2/c{c}") for i in range(5)])
         for c in range(3)}
jobs = [(f"g{i}", cases, out / f"f{i}.png") for i in range(4)]
with Drawers(2) as drawers:
    started = sorted(p.pid for p in multiprocessing.active_children())
    done = drawers.draw(jobs)()
pids = sorted({pid for pid, _ in done})
alive = [pid for pid in started if Path(f"/proc/{pid}").exists()]
# a figure that cannot be written: its folder is a file
failing = [jobs[0], ("bad", cases, out / "f1.png" / "x.png")]
try:
    with Drawers(2) as drawers:
        drawers.draw(failing)()
    raised = None
except OSError as error:
    raised = type(error).__name__
# the caller's own work (the findings, the tables) fails while the figures are drawn
try:
    with Drawers(2) as drawers:
        drawers.draw(jobs)
        busy = [p.pid for p in multiprocessing.active_children()]
        raise RuntimeError("the tables failed")
except RuntimeError as error:
    caller = str(error)
busy_alive = [pid for pid in busy if Path(f"/proc/{pid}").exists()]
try:
    os.waitpid(-1, os.WNOHANG)
    unreaped = True
except ChildProcessError:  # no child at all: every worker was joined
    unreaped = False
print(json.dumps({"pids": pids, "started": started, "me": os.getpid(), "alive": alive,
                  "raised": raised, "children": len(multiprocessing.active_children()),
                  "unreaped": unreaped, "drawn": [str(p) for _, p in done], "caller": caller,
                  "busy": busy, "busy_alive": busy_alive}))
"""


def test_figures_drawn_in_parallel_end_every_worker_on_success_and_on_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _DRAW, str(tmp_path)], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["drawn"] == [str(tmp_path / f"f{i}.png") for i in range(4)]
    assert all((tmp_path / f"f{i}.png").stat().st_size > 0 for i in range(4))
    assert len(said["started"]) == 2  # forked on entry, before any figure was asked for
    assert said["me"] not in said["pids"] and set(said["pids"]) <= set(said["started"])
    assert said["alive"] == []  # each worker's pid gone once the figures were drawn
    assert said["raised"] in ("NotADirectoryError", "FileExistsError")
    assert said["caller"] == "the tables failed"
    assert len(said["busy"]) == 2 and said["busy_alive"] == []  # ended though not waited for
    assert said["children"] == 0 and said["unreaped"] is False
