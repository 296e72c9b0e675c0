"""Temporary git repositories of a trainer under test for harness.bisect's tests, and the tool
run on them as a user runs it (a process of its own, in another folder than this project)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_TRAINER = REPO / "tests" / "plugin" / "fake_trainer.py"
# Fixed names and dates: the same commits every time (git bisect's choices after a skip do
# not depend on them, but a failing test is easier to follow with stable shas).
GIT_ENV = {"GIT_AUTHOR_NAME": "bisect test", "GIT_AUTHOR_EMAIL": "bisect@example.invalid",
           "GIT_COMMITTER_NAME": "bisect test", "GIT_COMMITTER_EMAIL": "bisect@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV, "LC_ALL": "C"}, check=True)
    return done.stdout.strip()


def head(repo: Path) -> tuple[str, str]:
    """(branch or "", sha)."""
    branch = subprocess.run(["git", "-C", str(repo), "symbolic-ref", "--quiet", "--short",
                             "HEAD"], capture_output=True, text=True).stdout.strip()
    return branch, git(repo, "rev-parse", "HEAD")


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} is not there exactly once"
    path.write_text(text.replace(old, new))


@dataclass
class Commits:
    repo: Path
    shas: list[str]  # commit 0 .. 9, oldest first

    def __getitem__(self, index: int) -> str:
        return self.shas[index]


def commit_ten(repo: Path, changes: dict[int, callable]) -> Commits:
    """Commit 0 is the tree as it is; commits 1..9 each add a line to NOTES and make the
    change (or tuple of changes) given for their number."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "commit 0: the trainer")
    shas = [git(repo, "rev-parse", "HEAD")]
    for number in range(1, 10):
        with open(repo / "NOTES", "a") as notes:
            notes.write(f"note {number}\n")
        subject = f"commit {number}"
        made = changes.get(number, ())
        for change in made if isinstance(made, tuple) else (made,):
            subject += (": " if subject.endswith(str(number)) else ", ") + change(repo)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", subject)
        shas.append(git(repo, "rev-parse", "HEAD"))
    return Commits(repo, shas)


# -- a foreign trainer through the command backend (tests/plugin's fake trainer) ------------

PLANT_OLD = "        loss = 5.0 - 0.125 * step\n"
PLANT_NEW = "        loss = 5.0 - 0.125 * step + (0.01 if args.world_size > 1 else 0)\n"


def fake_config(case_ids=("pp2", "pp2-vpp", "hang")) -> dict:
    return {
        "models": ["gpt2"],
        "model_files": {"gpt2": {"checkpoint": "gpt2.bin", "input_bin": "gpt2_tokens.bin"}},
        "trainer": {"backend": "command", "version": "fake-1", "command": [
            "{python}", "trainer.py", "--case", "{case}", "--world_size", "{world_size}",
            "--output_dir", "{output_dir}", "--gradients_dir", "{gradients_dir}",
            "--log_dir", "{log_dir}", "--model", "{model}", "--devices", "{devices}",
            "{flags}"]},
        "defaults": {"num_iteration": 3, "batch_size": 1, "sequence_length": 8},
        "test_groups": [{"tag": "fake", "tests": [
            {"id": i, "args": {"pipeline_parallel": 2}} for i in case_ids]}],
    }


def plant_loss(repo: Path) -> str:
    replace_line(repo / "trainer.py", PLANT_OLD, PLANT_NEW)
    return "the loss of a multi-rank run is off by 0.01"


def break_build(repo: Path) -> str:
    (repo / "BROKEN").write_text("the build fails while this file is here\n")
    return "BROKEN added"


def mend_build(repo: Path) -> str:
    (repo / "BROKEN").unlink()
    return "BROKEN removed"


def drop_case(repo: Path) -> str:
    (repo / "cases.json").write_text(json.dumps(fake_config(("pp2-vpp", "hang")), indent=2))
    return "fake/gpt2/pp2 renamed away"


def restore_case(repo: Path) -> str:
    (repo / "cases.json").write_text(json.dumps(fake_config(), indent=2))
    return "fake/gpt2/pp2 back"


# Where git bisect looks in ten commits with 0 good and 9 bad (its choices after a skip are
# deterministic): 4 (its build fails: skipped), 5 (no such case: skipped), 2, 7, 8 (bad).
BROKEN_AT, MISSING_AT, PLANTED_AT = 4, 5, 8
assert MISSING_AT == BROKEN_AT + 1  # the build is mended where the case goes away


def fake_trainer_repo(root: Path) -> Commits:
    repo = root / "trainer"
    repo.mkdir()
    shutil.copy(FAKE_TRAINER, repo / "trainer.py")
    (repo / "gpt2.bin").write_bytes(b"gpt2" * 8)
    (repo / "gpt2_tokens.bin").write_bytes(b"tokens" * 8)
    (repo / "cases.json").write_text(json.dumps(fake_config(), indent=2))
    return commit_ten(repo, {BROKEN_AT: break_build, MISSING_AT: (mend_build, drop_case),
                             MISSING_AT + 1: restore_case, PLANTED_AT: plant_loss})


FAKE_SESSION = ["cases.json", "--harness-device", "cpu", "--gpus", "2"]


def bisect(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300
           ) -> subprocess.CompletedProcess:
    """`python -m harness.bisect ARGS` from another folder, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "harness.bisect", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _interruptible() -> None:
    """In the child before it runs: SIGINT to its default. A shell that starts a job in the
    background (`bash .ci/run &`, nohup'd) sets SIGINT to ignored for everything it starts, and
    Python then installs no KeyboardInterrupt handler: a test sending SIGINT to the tool must
    not depend on how its runner was started (seen: the Ctrl-C test timed out in such a run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_bisect(*args: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.bisect", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=_interruptible)
