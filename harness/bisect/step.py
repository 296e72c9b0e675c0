"""The test `git bisect run` calls at each commit: the cached verdict, or the user's build
(a failing build is `git bisect skip`, exit 125) and then the case's session; exit 0 good,
1 bad, 125 skip, 128 or more to stop the bisect (interrupted, or a problem of this tool's own).

    python -I STEP_SCRIPT SPEC.json      (the script cli.py writes beside SPEC.json)

Every commit it judges is appended to the run's steps log, which the command line reads back
for its summary, and its verdict line goes to stderr."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.launch.process import run_process, tail
from harness.contracts.records import append_jsonl

from .cache import VerdictCache, key
from .git import Git, last_line
from .verdict import EXIT, SKIP, Threshold, Verdict, run_case

ABORT = 128  # any code over 127 but 125 ends `git bisect run`
INTERRUPTED = 130


@dataclass(frozen=True)
class Spec:
    """What every step of one bisect shares (written by cli.py as JSON)."""
    repo: str
    case: str
    test_args: list
    build: str | None
    threshold: dict | None
    cache: str
    steps_log: str
    timeout_s: float
    python: str

    @classmethod
    def read(cls, path: str | Path) -> "Spec":
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.__dict__, indent=2) + "\n")
        return path

    def key(self, sha: str) -> str:
        return key(sha, self.build, self.test_args, self.case, self.threshold)


def judge(spec: Spec, sha: str, subject: str) -> dict:
    """The commit's verdict as a steps-log entry: from the cache, else built and run now (and
    then cached)."""
    cache = VerdictCache(spec.cache)
    entry_key = spec.key(sha)
    cached = cache.get(entry_key)
    if cached is not None:
        return {**cached, "sha": sha, "subject": subject, "cached": True, "built": False,
                "session": False}
    run_dir = cache.run_dir(entry_key)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    repo = Path(spec.repo)
    built, build_s, session_s = False, 0.0, 0.0
    verdict = None
    if spec.build:
        result = run_process(["sh", "-c", spec.build], os.environ, spec.timeout_s,
                             run_dir / "build.stdout", run_dir / "build.stderr", cwd=repo)
        built, build_s = True, result.duration_s
        if result.timed_out:
            verdict = Verdict(SKIP, f"the build timed out after {spec.timeout_s:.0f} s")
        elif result.returncode != 0:
            said = last_line(tail(result.stderr) or tail(result.stdout))
            verdict = Verdict(SKIP, f"the build failed (exit {result.returncode}): {said}")
    session = False
    if verdict is None:
        threshold = Threshold(**spec.threshold) if spec.threshold else None
        verdict, result = run_case(repo, list(spec.test_args), spec.case, threshold, run_dir,
                                   spec.timeout_s, python=spec.python)
        session, session_s = True, result.duration_s
    entry = {**verdict.to_dict(), "sha": sha, "subject": subject, "build_s": build_s,
             "session_s": session_s, "run_dir": str(run_dir), "at": time.time()}
    cache.put(entry_key, entry)
    return {**entry, "cached": False, "built": built, "session": session}


def describe(entry: dict) -> str:
    cost = "from the cache" if entry.get("cached") else ", ".join(
        part for part in (f"build {entry['build_s']:.1f} s" if entry.get("built") else "",
                          f"session {entry['session_s']:.1f} s" if entry.get("session") else "")
        if part)
    return (f"harness.bisect: {entry['sha'][:12]} {entry['subject']!r}: {entry['outcome']}: "
            f"{entry['line']} [{cost}]")


def _terminated(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(spec_path: str) -> int:
    signal.signal(signal.SIGTERM, _terminated)  # the way out that ends the build or session
    try:
        spec = Spec.read(spec_path)
        git = Git(spec.repo)
        sha = git.run("rev-parse", "HEAD").stdout.strip()
        entry = judge(spec, sha, git.subject(sha))
        append_jsonl(spec.steps_log, entry)
        print(describe(entry), file=sys.stderr, flush=True)
        return EXIT[entry["outcome"]]
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as error:  # never a verdict: exit 1 would mark the commit bad
        print(f"harness.bisect: step failed: {type(error).__name__}: {error}", file=sys.stderr,
              flush=True)
        try:
            append_jsonl(Spec.read(spec_path).steps_log,
                         {"outcome": "abort", "line": f"{type(error).__name__}: {error}"})
        except Exception:
            pass
        return ABORT

