"""Read one session's results (format harness.result/1, see docs/results_format.md) without
trusting them: an interrupted or crashed session still reports what it holds.

Unlike `harness.results.read_results` (strict, for the plugin's own tests) nothing here raises on
content: a line that is not JSON, not a record, of another format or with a bad status becomes a
`BadLine` the report lists; a record missing keys gets them as null. What the session should
have held but did not is found two ways: the optional `session.json` header's list of collected
cases, and case folders the runner created (`cases/<tag>/<model>/<id>/`) with no record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.records import FIELDS, READABLE_FORMATS, RESULT_FORMAT, STATUSES
from harness.results.session import HEADER_NAME  # optional; docs/results_format.md
from harness.results.session import SESSION_FORMAT as HEADER_FORMAT
from harness.contracts.records import RESULTS_NAME, scan_jsonl

# Keys a report reads that older records (and, until the record type has them, every record)
# lack: the step number of each loss (harness.report.steps). Null when absent, like any key.
STEP_FIELDS = ("steps", "reference_steps")
DEFAULT_ROOT = Path("reports") / "harness"  # the plugin's default --harness-output


class NoResults(Exception):
    """Nothing to report on: the message says where it looked."""


@dataclass(frozen=True)
class BadLine:
    path: str
    number: int
    problem: str
    text: str  # the start of the line, for the reader to recognize it


@dataclass
class Session:
    paths: list[Path]
    records: list[dict] = field(default_factory=list)
    bad_lines: list[BadLine] = field(default_factory=list)
    header: dict = field(default_factory=dict)  # session.json, {} when absent
    unrecorded: list[str] = field(default_factory=list)  # case names with no result
    notes: list[str] = field(default_factory=list)  # e.g. duplicate records

    @property
    def label(self) -> str:
        ids = sorted({r["session"] for r in self.records if r.get("session")})
        if self.header.get("session"):
            return str(self.header["session"])
        if len(ids) == 1:
            return ids[0]
        return ", ".join(ids) if ids else self.paths[0].parent.name

    @property
    def folder(self) -> Path:
        return self.paths[0].parent


def latest_results(root: Path = DEFAULT_ROOT) -> Path:
    """The newest `sessions/<time>-<pid>/results.jsonl` under the output root. Folder names
    start with the start time (YYYYmmdd-HHMMSS), so name order is time order."""
    sessions = root / "sessions"
    # A session interrupted before its first result has only its header: report it too.
    folders = {p.parent for name in (RESULTS_NAME, HEADER_NAME) for p in sessions.glob(f"*/{name}")}
    found = [f / RESULTS_NAME for f in sorted(folders, key=lambda f: (f.name, f.stat().st_mtime))]
    if not found:
        raise NoResults(f"no results found: no {sessions}/*/{RESULTS_NAME} "
                        f"(run the tests first, or pass a results file or session folder)")
    return found[-1]


def default_results() -> Path:
    """What to report on when nothing is named: the latest session under $HARNESS_OUTPUT when
    set; else the session the last pytest run wrote (the pointer file); else the latest under
    ./reports/harness."""
    from harness.results.location import OUTPUT_ENV, env_output, last_session, pointer_file

    output = env_output()
    if output is not None:
        try:
            return latest_results(output)
        except NoResults as error:
            raise NoResults(f"{error} (from ${OUTPUT_ENV})") from None
    folder = last_session()
    if folder is not None:
        return folder / RESULTS_NAME
    try:
        return latest_results(DEFAULT_ROOT)
    except NoResults as error:
        raise NoResults(f"{error}; no last session recorded in {pointer_file()}; "
                        f"${OUTPUT_ENV} not set") from None


def resolve(argument: str | Path) -> Path:
    """A results file, a session folder, or an output root (its latest session)."""
    path = Path(argument)
    if path.is_file():
        return path
    if (path / RESULTS_NAME).is_file() or (path / HEADER_NAME).is_file():
        return path / RESULTS_NAME  # a header alone: a session with no result yet
    if (path / "sessions").is_dir():
        return latest_results(path)
    raise NoResults(f"{path}: not a results file, a session folder holding {RESULTS_NAME}, "
                    f"or an output folder holding sessions/")


def read_session(paths: list[Path]) -> Session:
    """Merge one or more results files (e.g. shards of one session) into one Session."""
    session = Session(paths=[Path(p) for p in paths])
    by_name: dict[str, int] = {}
    for path in session.paths:
        for record in _read_file(path, session):
            name = record["name"]
            if name in by_name:  # a case recorded twice (a rerun appending): the last one wins
                session.notes.append(f"{name} is recorded more than once; the last record is used")
                session.records[by_name[name]] = record
            else:
                by_name[name] = len(session.records)
                session.records.append(record)
    session.header = _read_header(session.folder, session)
    session.unrecorded = _unrecorded(session, set(by_name))
    return session


def _read_file(path: Path, session: Session) -> list[dict]:
    if not path.is_file():
        session.notes.append(f"{path} does not exist: no case recorded a result")
        return []
    records = []
    for line in scan_jsonl(path):
        problem, record = (_cut(line.problem), None) if line.problem else _parse(line.value)
        if problem:
            session.bad_lines.append(BadLine(str(path), line.number, problem, line.text[:120]))
        elif record is not None:
            records.append(record)
    return records


def _cut(problem: str) -> str:
    """The report's words for a results line cut short: it is the session that stopped."""
    return ("truncated (the session stopped while writing it)"
            if problem.startswith("truncated") else problem)


def _parse(data) -> tuple[str | None, dict | None]:
    if not isinstance(data, dict):
        return f"not a record (a JSON {type(data).__name__})", None
    kind = data.get("format")
    if kind == HEADER_FORMAT:  # a header line inside the results file is allowed too
        return None, None
    if kind not in READABLE_FORMATS:
        return f"format {kind!r}, expected {RESULT_FORMAT!r}", None
    if data.get("status") not in STATUSES:
        return f"status {data.get('status')!r}, expected one of {', '.join(STATUSES)}", None
    if not data.get("name"):
        parts = [data.get(k) for k in ("tag", "model", "case_id")]
        if not all(parts):
            return "no case name (name, or tag / model / case_id)", None
        data["name"] = "/".join(parts)
    record = {key: data.get(key) for key in (*FIELDS, *STEP_FIELDS)}
    record["errors"] = record["errors"] or []
    for key in ("tag", "model", "case_id"):  # derivable from the name tag/model/id
        if not record[key]:
            pieces = record["name"].split("/")
            if len(pieces) == 3:
                record[key] = pieces[("tag", "model", "case_id").index(key)]
    return None, record


def _read_header(folder: Path, session: Session) -> dict:
    path = folder / HEADER_NAME
    if not path.is_file():
        return {}
    try:
        header = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        session.notes.append(f"{path}: unreadable session header ({error})")
        return {}
    if not isinstance(header, dict):
        session.notes.append(f"{path}: the session header is not a JSON object; ignored")
        return {}
    if header.get("format") not in (None, HEADER_FORMAT):
        session.notes.append(f"{path}: session header format {header.get('format')!r}, "
                             f"expected {HEADER_FORMAT!r}; ignored")
        return {}
    return header


def _unrecorded(session: Session, recorded: set[str]) -> list[str]:
    expected: set[str] = set()
    collected = session.header.get("collected")
    if isinstance(collected, list):
        expected.update(str(name) for name in collected)
    for path in session.paths:  # folders the runner made: cases/<tag>/<model>/<id>/
        cases = path.parent / "cases"
        if cases.is_dir():
            expected.update("/".join(p.relative_to(cases).parts) for p in cases.glob("*/*/*")
                            if p.is_dir())
    return sorted(expected - recorded)
