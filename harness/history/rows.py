"""One line of the history: `HistoryRow`, a case's result on one night, as the history keeps it
(format harness.history/1, one JSON object per line of `history.jsonl`), and how a row is made
from a session's result record and header.

A row keeps what a series over the nights needs and nothing else: the verdict and its two
margins (loss and gradients: threshold / worst, harness.compare.verdict.margin), the last loss,
throughput with its spread, step time and peak memory, and which session, machine, config and
trainer build it came from. The session folder it was read from is `origin`; the rest of the
case (its logs, its diff) stays there.

Rows are validated on construction: a wrong type or an unknown key is a ValueError naming the
key, the value and where the row came from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results.noise import relative_error
from harness.results.values import number, section

HISTORY_FORMAT = "harness.history/1"
SOURCES = ("session", "run-folder")  # a harness session, or a foreign trainer's own run folder
STATUSES = ("passed", "failed", "skipped", "error", "ran")  # ran: a run folder, not judged


@dataclass(frozen=True)
class HistoryRow:
    session: str  # the session's name (a run folder: <machine>/<date>/<branch>_<sha>)
    date: str  # when it started, local time YYYY-mm-ddTHH:MM:SS+zzzz (a run folder: its time)
    config: str  # the test config (a run folder: InfiniTrain's CONFIG_FILE, or "infinitrain")
    machine: str | None
    trainer: str  # harness, infinitrain, command
    build: str | None  # the trainer's version (InfiniTrain: its build's content hash)
    commit: str | None  # the trainer's source commit (the bundled trainer: the harness's)
    branch: str | None
    name: str  # tag/model/id
    status: str
    self_check: str | None = None
    baseline: str | None = None  # the baseline check's status, when one was asked for
    loss_margin: float | None = None  # threshold / worst; inf: equal
    gradient_margin: float | None = None
    last_loss: float | None = None
    last_step: int | None = None
    tokens_per_s: float | None = None
    tokens_per_s_spread: float | None = None  # relative standard error of the mean step time
    step_ms: float | None = None
    peak_memory_mb: float | None = None
    reason: str | None = None
    source: str = "session"
    origin: str | None = None  # the folder it was read from
    format: str = HISTORY_FORMAT

    def __post_init__(self) -> None:
        where = f"history row {self.name!r} of {self.session!r}"
        values = self.__dict__
        # Whether a value fits its field depends on its type alone, and the rows of a history
        # share a few type patterns: each pattern is checked field by field once (a year of
        # nights is 73,000 rows of 27 fields).
        pattern = tuple(map(type, map(values.__getitem__, FIELD_ORDER)))
        if pattern not in _PATTERNS_CHECKED:
            for name, types, allows_bool in _FIELD_TYPES:
                value = values[name]
                if not isinstance(value, types) or (value.__class__ is bool
                                                    and not allows_bool):
                    raise ValueError(f"{where}: {name} = {value!r}, expected {_HINTS[name]}")
            _PATTERNS_CHECKED.add(pattern)
        if self.status not in STATUSES:
            raise ValueError(f"{where}: status {self.status!r}, expected one of "
                             f"{', '.join(STATUSES)}")
        if self.source not in SOURCES:
            raise ValueError(f"{where}: source {self.source!r}, expected one of "
                             f"{', '.join(SOURCES)}")
        if self.format != HISTORY_FORMAT:
            raise ValueError(f"{where}: format {self.format!r}, expected {HISTORY_FORMAT!r}")
        if self.name.count("/") != 2:
            raise ValueError(f"{where}: name {self.name!r}, expected tag/model/id")

    @property
    def tag(self) -> str:
        return self.name.split("/")[0]

    @property
    def model(self) -> str:
        return self.name.split("/")[1]

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes a row one night of one case: a session copied twice is read once."""
        return self.session, self.date, self.name

    @property
    def build_label(self) -> str:
        """The build as people name it: the short commit, else the trainer's version."""
        if self.commit:
            return self.commit[:7]
        return self.build or "unknown build"

    def values(self) -> tuple:
        """Every field's value in FIELD_ORDER (the history's cache keeps rows so)."""
        return tuple(map(self.__dict__.__getitem__, FIELD_ORDER))

    @classmethod
    def trusted(cls, values: tuple) -> HistoryRow:
        """A row from `values()` of a row validated before (the history's cache, which only a
        reader that validated them writes): not validated again."""
        row = object.__new__(cls)
        row.__dict__.update(zip(FIELD_ORDER, values))
        return row

    def to_json(self) -> dict:
        return {f.name: _json_float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> HistoryRow:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a history row is a JSON object, not "
                             f"{type(data).__name__}")
        if not _NAMES.issuperset(data):
            unknown = sorted(set(data) - _NAMES)
            raise ValueError(f"{where}: unknown key {unknown[0]!r} in a {HISTORY_FORMAT} row")
        values = data
        written = [k for k in _FLOATS if data.get(k).__class__ is str]  # "inf", "nan"
        if written:
            values = {**data, **{k: _float_back(data[k]) for k in written}}
        try:
            if len(values) == len(_NAMES):  # every field given, as the history writes rows:
                row = object.__new__(cls)  # the frozen __init__'s 27 setattr calls skipped
                row.__dict__.update(values)
                row.__post_init__()
                return row
            return cls(**values)
        except TypeError as error:  # a required key missing
            raise ValueError(f"{where}: {error}") from None
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


_HINTS = {f.name: str(f.type) for f in dataclasses.fields(HistoryRow)}
_NAMES = frozenset(_HINTS)
_FLOATS = {name for name, hint in _HINTS.items() if "float" in hint}
_KINDS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
          "None": (type(None),)}


def _types(hint: str) -> tuple[tuple[type, ...], bool]:
    """A field's annotation (`float | None`) as the types a value may have, and whether a bool
    is one of them (bool is an int to isinstance; a float field given True is refused)."""
    kinds = [part.strip() for part in hint.split("|")]
    return tuple(t for kind in kinds for t in _KINDS[kind]), "bool" in kinds


_FIELD_TYPES = tuple((name, *_types(hint)) for name, hint in _HINTS.items())
FIELD_ORDER = tuple(_HINTS)
_PATTERNS_CHECKED: set[tuple[type, ...]] = set()  # value types known to fit (__post_init__)


def _json_float(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf: "inf", as result records write it
    return value


def _float_back(value: Any) -> Any:
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


# ---------------------------------------------------------------- from a session's records


def _margin(record: dict, key: str) -> float | None:
    return number(section(section(record, key), "relative").get("margin"))


def _last_loss(record: dict) -> tuple[float | None, int | None]:
    losses = record.get("losses")
    if not isinstance(losses, list) or not losses:
        return None, None
    steps = record.get("steps")
    step = steps[-1] if isinstance(steps, list) and len(steps) == len(losses) else len(losses)
    return number(losses[-1]), step if isinstance(step, int) else None


def _one_line(text: Any) -> str | None:
    if not text:
        return None
    first = str(text).strip().splitlines()
    return first[0][:300] if first else None


def session_rows(header: dict, records: list[dict], origin: Path) -> list[HistoryRow]:
    """The rows of one session: one per case record (the last record of a case wins, as the
    report reads it). `header` is its session.json ({} when it has none: the session name, date
    and machine then come from the records and the folder)."""
    trainer = section(header, "trainer")
    rows = []
    for record in records:
        env = section(record, "environment")
        loss, step = _last_loss(record)
        baseline = section(record, "baseline")
        spread = relative_error(record)
        rows.append(HistoryRow(
            session=str(header.get("session") or record.get("session") or origin.name),
            date=str(header.get("started_at") or record.get("started_at") or ""),
            config=str(header.get("config_path") or "unknown config"),
            machine=_str(header.get("host") or env.get("host")),
            trainer=str(record.get("trainer") or trainer.get("name") or "harness"),
            build=_str(trainer.get("version")),
            commit=_str(trainer.get("git_commit") or header.get("git_commit")),
            branch=_str(trainer.get("git_branch")),
            name=str(record["name"]), status=str(record["status"]),
            self_check=_str(record.get("self_check")),
            baseline=_str(baseline.get("status")) if baseline else None,
            loss_margin=_margin(record, "loss"), gradient_margin=_margin(record, "gradients"),
            last_loss=loss, last_step=step,
            tokens_per_s=number(record.get("tokens_per_s")), tokens_per_s_spread=spread,
            step_ms=number(record.get("step_time_ms")),
            peak_memory_mb=number(record.get("peak_memory_mb")),
            reason=_one_line(record.get("reason")) if record["status"] != "passed" else None,
            source="session", origin=str(origin)))
    return rows


def _str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
