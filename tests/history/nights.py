"""Session folders and rows for the history's tests: nights made to order."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from harness.history.rows import HistoryRow
from harness.results.records import new_record
from harness.results.session import SESSION_FORMAT

START = datetime(2026, 11, 1, 2, 17, tzinfo=timezone.utc)


def night(i: int) -> str:
    return (START + timedelta(days=i)).strftime("%Y-%m-%dT%H:%M:%S%z")


def record(name: str, status: str = "passed", *, tokens: float | None = 1000.0,
           memory: float | None = 400.0, loss_margin: float | None = 900.0,
           grad_margin: float | None = 150.0, session: str = "s", reason: str | None = None,
           step_times: list | None = None) -> dict:
    tag, model, case_id = name.split("/")
    return new_record(
        session=session, name=name, tag=tag, model=model, case_id=case_id, status=status,
        reason=reason, trainer="harness", losses=[5.5, 5.4, 5.3], steps=[1, 2, 3],
        tokens_per_s=tokens, peak_memory_mb=memory, step_time_ms=100.0,
        step_times_ms=step_times if step_times is not None else [100.0, 101.0, 99.0],
        loss={"relative": {"margin": loss_margin}} if loss_margin is not None else None,
        gradients={"relative": {"margin": grad_margin}} if grad_margin is not None else None,
        environment={"host": "box"})


def write_session(output: Path, i: int, records: list[dict], *, config: str = "configs/a.json",
                  commit: str = "a" * 40, host: str = "box", folder: str | None = None) -> Path:
    """Session `i` (night i) with these records under output/sessions/."""
    name = f"2026{i:04d}-021700-{100 + i}"
    path = output / "sessions" / (folder or name)
    path.mkdir(parents=True)
    header = {"format": SESSION_FORMAT, "session": name, "started_at": night(i),
              "finished_at": night(i), "config_path": config, "git_commit": commit,
              "git_dirty": False, "driver": None, "torch": "2.13.0",
              "collected": [r["name"] for r in records], "args": [],
              "trainer": {"name": "harness", "version": "harness-1", "build_dir": None,
                          "device": "cpu"}, "host": host}
    (path / "session.json").write_text(json.dumps(header))
    (path / "results.jsonl").write_text(
        "".join(json.dumps({**r, "session": name}) + "\n" for r in records))
    return path


def row(i: int, status: str = "passed", *, name: str = "basic/gpt2/pp2", **values) -> HistoryRow:
    defaults = dict(session=f"night-{i:03d}", date=night(i), config="configs/a.json",
                    machine="box", trainer="harness", build="harness-1",
                    commit=values.pop("commit", "a" * 40), branch=None, name=name,
                    status=status, tokens_per_s=1000.0, peak_memory_mb=400.0,
                    loss_margin=900.0, gradient_margin=150.0)
    defaults.update(values)
    return HistoryRow(**defaults)
