"""One case at one commit: the harness session that runs it (`python -m pytest ARGS -k CASE
--harness-output DIR`, importing the checkout's own code), and its verdict read back from the
session's result record (docs/results_format.md) as `git bisect run` wants it."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.launch.process import ProcessResult, run_process, tail
from harness.runner.settings import flag_of
from harness.contracts.records import RESULTS_NAME, read_json, read_jsonl

GOOD, BAD, SKIP = "good", "bad", "skip"
EXIT = {GOOD: 0, BAD: 1, SKIP: 125}  # git bisect run's codes; 125 is `git bisect skip`

# -k matches substrings (`basic/gpt2/pp2` selects `basic/gpt2/pp2-vpp2` too): this plugin, a
# file of its own on the session's path (older commits of the checkout have no
# harness.bisect), keeps the one case named in HARNESS_BISECT_CASE.
SELECT_MODULE = "_harness_bisect_select"
SELECT_PLUGIN = '''"""harness.bisect: keep only the case named exactly in HARNESS_BISECT_CASE."""
import os


def pytest_collection_modifyitems(config, items):
    name = os.environ.get("HARNESS_BISECT_CASE")
    if not name:
        return
    dropped = [item for item in items if item.name != name]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.name == name]
'''


@dataclass(frozen=True)
class Threshold:
    """A speed or memory threshold as the test instead of the case's verdict."""
    kind: str  # "slower-than" (tokens/s) or "memory-above" (MB)
    value: float

    def to_dict(self) -> dict:
        return asdict(self)

    def judge(self, record: dict) -> tuple[str, str]:
        name = record.get("name")
        if self.kind == "slower-than":
            got, unit, what = number(record.get("tokens_per_s")), "tokens/s", "tokens_per_s"
            bad = got is not None and got < self.value
            sign = "<" if bad else ">="
        else:
            got, unit, what = number(record.get("peak_memory_mb")), "MB", "peak_memory_mb"
            bad = got is not None and got > self.value
            sign = ">" if bad else "<="
        if got is None:
            return SKIP, (f"{name} has no {what} at this commit (status {record.get('status')}: "
                          f"{record.get('reason') or 'no reason given'})")
        return (BAD if bad else GOOD,
                f"{name}: {got:,.1f} {unit} {sign} {self.value:,.1f} (--{self.kind})")


@dataclass(frozen=True)
class Verdict:
    """A commit's verdict: good, bad or skip, why in one line, and for a bad one the case's
    failure text (the record's `errors`, else its `reason`)."""
    outcome: str
    line: str
    failure: str = ""
    status: str | None = None
    tokens_per_s: float | None = None
    peak_memory_mb: float | None = None
    session_dir: str | None = None
    facts: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT[self.outcome]

    def to_dict(self) -> dict:
        return asdict(self)


def number(value) -> float | None:
    try:
        got = float(value)
    except (TypeError, ValueError):
        return None
    return got if math.isfinite(got) else None


def case_record(session_dir: Path, case: str) -> dict | None:
    """The case's last result record in a session folder, or None."""
    records = [r for r in read_jsonl(session_dir / RESULTS_NAME)
               if isinstance(r, dict) and r.get("name") == case]
    return records[-1] if records else None


def read_verdict(output: Path, case: str, threshold: Threshold | None,
                 returncode: int | None, output_tail: str = "") -> Verdict:
    """The verdict of a finished session under --harness-output `output`.

    good / bad: the case's record says passed / failed (or, with a threshold, its number is on
    that side). skip: the case does not exist at this commit (nothing collected), it was
    skipped there, or a harness-side problem (an `error` record, a session that ended with no
    record)."""
    sessions = sorted(p for p in (output / "sessions").glob("*") if p.is_dir())
    session = sessions[-1] if sessions else None
    record = case_record(session, case) if session else None
    where = str(session) if session else None
    if record is None:
        header = read_json(session / "session.json") if session else None
        collected = header.get("collected") if isinstance(header, dict) else None
        said = f"pytest exit {returncode}" if returncode is not None else "timed out"
        if isinstance(collected, list) and case in collected:
            line = f"{case}: the session ended without its record ({said}: {last(output_tail)})"
        elif returncode in (0, 5):  # 5: nothing collected
            line = f"{case} does not exist at this commit (nothing collected)"
        else:
            line = f"{case}: the session stopped before the case ran ({said}: {last(output_tail)})"
        return Verdict(SKIP, line, session_dir=where)
    status = record.get("status")
    facts = {"status": status, "tokens_per_s": number(record.get("tokens_per_s")),
             "peak_memory_mb": number(record.get("peak_memory_mb")), "session_dir": where}
    failure = "\n\n".join(e for e in record.get("errors") or [] if isinstance(e, str)) \
        or (record.get("reason") or "")
    if status in ("skipped", "error"):
        what = "skipped" if status == "skipped" else "a harness-side error"
        return Verdict(SKIP, f"{case}: {what} at this commit: {record.get('reason')}",
                       failure=failure, **facts)
    if status not in ("passed", "failed"):
        return Verdict(SKIP, f"{case}: a record with status {status!r}", **facts)
    if threshold is not None:
        outcome, line = threshold.judge(record)
        return Verdict(outcome, line, failure=line if outcome == BAD else "", **facts)
    if status == "passed":
        return Verdict(GOOD, f"{case}: passed", **facts)
    return Verdict(BAD, record.get("reason") or f"{case}: failed", failure=failure, **facts)


def last(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def session_argv(python: str, test_args: list[str], case: str, output: Path) -> list[str]:
    return [python, "-m", "pytest", *test_args, "-k", case, flag_of("output"), str(output),
            "-p", SELECT_MODULE, "-p", "no:cacheprovider"]


def session_env(checkout: Path, plugin_dir: Path, case: str, base: dict | None = None) -> dict:
    """The session imports the checkout's code first (PYTHONPATH, as its cwd would for
    `python -m`), finds the selection plugin, and leaves the user's last-session pointer
    alone."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(checkout), str(plugin_dir), env.get("PYTHONPATH", "")) if p)
    env["HARNESS_BISECT_CASE"] = case
    env["HARNESS_LAST_SESSION"] = str(plugin_dir / "last_session")
    env.pop("HARNESS_OUTPUT", None)
    return env


def write_plugin(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{SELECT_MODULE}.py"
    path.write_text(SELECT_PLUGIN)
    return folder


def run_case(checkout: Path, test_args: list[str], case: str, threshold: Threshold | None,
             run_dir: Path, timeout_s: float, python: str = sys.executable
             ) -> tuple[Verdict, ProcessResult]:
    """One harness session for the case at the checked-out commit, and its verdict."""
    output = run_dir / "harness"
    plugin_dir = write_plugin(run_dir / "plugin")
    result = run_process(session_argv(python, test_args, case, output),
                         session_env(checkout, plugin_dir, case), timeout_s,
                         run_dir / "session.stdout", run_dir / "session.stderr", cwd=checkout)
    if result.timed_out:
        return Verdict(SKIP, f"{case}: the session timed out after {timeout_s:.0f} s"), result
    text = tail(result.stdout, 40) + "\n" + tail(result.stderr, 40)
    return read_verdict(output, case, threshold, result.returncode, text), result
