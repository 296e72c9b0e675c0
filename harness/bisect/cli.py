"""`python -m harness.bisect --good REV --bad REV TAG/MODEL/ID [options] -- PYTEST ARGS`: the
first commit at which a case fails (or gets slower, or bigger), by `git bisect run` with the
case's verdict as the test.

Exit codes: 0 the first bad commit was found; 1 the bisect ended without one (the range's ends
contradict the case, skipped commits hide it, or a step could not run); 2 bad input (nothing was
touched); 130 interrupted (SIGINT; 143 for SIGTERM), with the checkout restored."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import harness
from harness.launch import process
from harness.contracts.records import read_jsonl

from .cache import default_dir
from .git import Git, GitError, Head, candidates, first_bad
from .step import Spec
from .summary import Cost, first_bad_lines, judged, skipped_lines
from .verdict import BAD, GOOD, Threshold

NOT_FOUND, USAGE, INTERRUPTED = 1, 2, 130
PROG = "harness.bisect"
STEP_SCRIPT = """import sys
sys.path.insert(0, {root!r})
from harness.bisect.step import main
sys.exit(main(sys.argv[1]))
"""


class BadInput(Exception):
    """One line naming what is wrong and where; nothing has been touched."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.bisect",
        description="Find the first commit at which a harness case fails (git bisect run).",
        epilog="Everything after `--` is the session's pytest arguments (the config, "
               "--harness-var, --infinitrain-build, --harness-baseline ...), as given to "
               "`python -m pytest` in the checkout. docs/bisect.md")
    p.add_argument("case", metavar="TAG/MODEL/ID", help="the case, as results name it")
    p.add_argument("--good", required=True, metavar="REV", help="a commit where the case passes")
    p.add_argument("--bad", required=True, metavar="REV", help="a later commit where it fails")
    p.add_argument("--repo", default=".", metavar="PATH",
                   help="the trainer's git checkout (default: the current folder)")
    p.add_argument("--build", default=None, metavar="CMD",
                   help="shell command run in the checkout before each session; a failing "
                        "build skips the commit (git bisect skip)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--slower-than", type=float, metavar="TOKENS_PER_S",
                       help="bad when the case's tokens/s is below this, not when it fails")
    which.add_argument("--memory-above", type=float, metavar="MB",
                       help="bad when the case's peak memory is above this, not when it fails")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help=f"verdicts of finished commits (default {default_dir()})")
    p.add_argument("--timeout", type=float, default=7200.0, metavar="SECONDS",
                   help="for each build and each session (default 7200)")
    return p


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def threshold_of(args) -> Threshold | None:
    if args.slower_than is not None:
        return Threshold("slower-than", args.slower_than)
    if args.memory_above is not None:
        return Threshold("memory-above", args.memory_above)
    return None


def check_case(case: str) -> None:
    parts = case.split("/")
    if len(parts) != 3 or not all(parts):
        raise BadInput(f"case {case!r}: expected TAG/MODEL/ID, e.g. basic/llama3/1")


def check_checkout(git: Git) -> None:
    if git.bisecting():
        raise BadInput(f"a bisect is already in progress in {git.repo} "
                       "(end it with `git bisect reset` first)")
    dirty = git.dirty()
    if dirty:
        shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
        raise BadInput(f"the checkout {git.repo} has uncommitted changes ({shown}): commit or "
                       "remove them first; harness.bisect checks out other commits and stashes "
                       "nothing")


def check_range(git: Git, good_rev: str, bad_rev: str) -> tuple[str, str]:
    good, bad = git.commit(good_rev, "--good"), git.commit(bad_rev, "--bad")
    if good == bad:
        raise BadInput(f"--good {good_rev} and --bad {bad_rev} are the same commit "
                       f"{good[:12]} in {git.repo}")
    if not git.is_ancestor(good, bad):
        raise BadInput(f"--good {good_rev} ({good[:12]}) is not an ancestor of --bad {bad_rev} "
                       f"({bad[:12]}) in {git.repo}: the good commit must be in the bad one's "
                       "history")
    return good, bad


def tool_root(top: Path, run_dir: Path) -> Path:
    """The folder holding the harness package the steps import: this one, or a copy of it
    when it lives in the checkout under bisect (whose files change with every commit)."""
    root = Path(harness.__file__).resolve().parent.parent
    if not root.is_relative_to(top.resolve()):
        return root
    copy = run_dir / "tool"
    shutil.copytree(root / "harness", copy / "harness",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # This process starts every child through the reaper by path: the copy's, too.
    process.REAPER = copy / "harness" / "launch" / "reaper.py"
    return copy


def run_child(argv: list[str], log: Path, cwd: Path) -> int:
    """A child run to its end, its processes ended on every way out (harness.launch.process);
    stdout to the log, stderr (the steps' verdict lines) to ours."""
    with open(log, "ab") as out:
        child = process.start(argv, os.environ, out, None, cwd=cwd)
        try:
            return child.wait()
        finally:
            process.end(child)


class Bisect:
    def __init__(self, git: Git, good: str, bad: str, args, test_args: list[str]) -> None:
        self.git, self.good, self.bad, self.args = git, good, bad, args
        self.run_dir = Path(tempfile.mkdtemp(prefix="harness-bisect-"))
        threshold = threshold_of(args)
        self.spec = Spec(repo=str(git.repo), case=args.case, test_args=test_args,
                         build=args.build, threshold=threshold.to_dict() if threshold else None,
                         cache=str(Path(args.cache or default_dir()).resolve()),
                         steps_log=str(self.run_dir / "steps.jsonl"), timeout_s=args.timeout,
                         python=sys.executable)
        spec_path = self.spec.write(self.run_dir / "spec.json")
        script = self.run_dir / "step.py"
        script.write_text(STEP_SCRIPT.format(root=str(tool_root(git.repo, self.run_dir))))
        self.step = [sys.executable, "-I", str(script), str(spec_path)]
        self.log = self.run_dir / "git-bisect.log"

    def entries(self) -> list[dict]:
        return [e for e in read_jsonl(self.spec.steps_log) if isinstance(e, dict)]

    def judge_endpoint(self, sha: str) -> dict:
        """A range end git takes on trust, judged: checked out and run as a step."""
        self.git.checkout(sha)
        run_child(self.step, self.log, self.git.repo)
        return judged(self.entries()).get(sha, {"outcome": "abort", "line": "no verdict"})

    def run(self) -> tuple[int, list[str]]:
        """Bisect with the checkout in bisect mode (the caller resets it); the exit code and
        the summary's lines."""
        self.git.bisect_start(self.bad, self.good)
        if self.git.between(self.good, self.bad) == 0:
            # Nothing to test between the ends (git names --bad at once; `git bisect run`
            # would judge whatever is checked out): the ends are judged below.
            output = f"{self.bad} is the first bad commit\n"
        else:
            run_child(self.git.bisect_run_argv(self.step), self.log, self.git.repo)
            output = self.log.read_text(errors="replace")
        stopped = [e for e in self.entries() if e.get("outcome") == "abort"]
        if stopped:
            return NOT_FOUND, [f"the bisect stopped: a step could not run: {stopped[-1]['line']}"]
        found = first_bad(output)
        if found is None:
            left = candidates(output)
            if left:
                return NOT_FOUND, [
                    "no single first bad commit: only skipped commits are left, the first bad "
                    "one is one of " + ", ".join(f"{c[:12]} {self.git.subject(c)!r}" for c in left)]
            return NOT_FOUND, [f"git bisect run ended without a first bad commit: "
                               f"{output.strip().splitlines()[-1] if output.strip() else 'no output'}"]
        # git trusts the range's ends; a result next to an untested end is checked on it.
        if found == self.bad and found not in judged(self.entries()):
            entry = self.judge_endpoint(found)
            if entry["outcome"] == GOOD:
                return NOT_FOUND, [f"--bad {self.args.bad} ({found[:12]}) is good: "
                                   f"{entry['line']}; nothing in the range fails"]
            if entry["outcome"] != BAD:
                return NOT_FOUND, [f"--bad {self.args.bad} ({found[:12]}) cannot be judged: "
                                   f"{entry['line']}"]
        if self.good in self.git.parents(found) and self.good not in judged(self.entries()):
            entry = self.judge_endpoint(self.good)
            if entry["outcome"] == BAD:
                return NOT_FOUND, [f"--good {self.args.good} ({self.good[:12]}) is bad too: "
                                   f"{entry['line']}; the case fails there already, so the range "
                                   "holds no first bad commit (give an older --good)"]
            if entry["outcome"] != GOOD:
                return NOT_FOUND, [f"--good {self.args.good} ({self.good[:12]}) cannot be "
                                   f"judged: {entry['line']}"]
        return 0, first_bad_lines(judged(self.entries())[found])


def _terminated(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    ours, test_args = split_args(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(ours)
    try:
        check_case(args.case)
        git = Git(Git(args.repo).top_level())
        check_checkout(git)
        good, bad = check_range(git, args.good, args.bad)
        before = git.head()
    except (BadInput, GitError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return USAGE
    previous = signal.signal(signal.SIGTERM, _terminated)
    bisect = None
    code, lines, interrupted = NOT_FOUND, [], None
    try:
        bisect = Bisect(git, good, bad, args, test_args)
        code, lines = bisect.run()
    except KeyboardInterrupt as stop:
        interrupted = str(stop) or "SIGINT"
    except GitError as error:
        lines = [str(error)]
    finally:
        restored = restore(git, before)
        entries = bisect.entries() if bisect else []
        if bisect:
            shutil.rmtree(bisect.run_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    cost = Cost.of(entries, time.monotonic() - started)
    if interrupted:
        print(f"{PROG}: interrupted ({interrupted}) after {cost.judged} commits: the running "
              f"step's processes were ended; {restored}", file=sys.stderr)
        return 143 if interrupted == "SIGTERM" else INTERRUPTED
    for line in skipped_lines(entries):
        print(line)
    for line in lines:
        print(line)
    print(cost.line())
    print(restored)
    return code


def restore(git: Git, before: Head) -> str:
    """`git bisect reset` when a bisect is on, then the checkout as it was: a line saying so."""
    try:
        if git.bisecting():
            git.bisect_reset()
        now = git.head()
        if now != before:
            if before.branch:
                git.run("checkout", "--quiet", before.branch)
            else:
                git.checkout(before.sha)
            now = git.head()
    except GitError as error:
        return f"the checkout could not be restored to {before.text()}: {error}"
    if now != before:
        return f"the checkout could not be restored to {before.text()} (it is at {now.text()})"
    return f"checkout restored: {before.text()} (git bisect reset)"
