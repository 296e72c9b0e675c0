"""The git plumbing of a bisect: revisions, ancestry, a clean work tree, and `git bisect`
itself (start, run, reset), always the real git, never a reimplementation of it."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


class GitError(Exception):
    """A git question with no usable answer; str() is one line naming what and where."""


@dataclass(frozen=True)
class Head:
    """Where a checkout stands: the branch (None: a detached HEAD) and the commit."""
    branch: str | None
    sha: str

    def text(self) -> str:
        return f"{self.branch} at {self.sha[:12]}" if self.branch else f"detached HEAD at {self.sha[:12]}"


# What git prints when a bisect ends, in English whatever the user's locale (LC_ALL=C).
_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit$", re.M)
_ANY_OF = re.compile(r"The first bad commit could be any of:\n((?:[0-9a-f]{40}\n?)+)")


class Git:
    """git in one work tree. Each command is short and runs to its end (subprocess.run kills
    it on any exception, KeyboardInterrupt included)."""

    def __init__(self, repo: str | os.PathLike) -> None:
        self.repo = Path(repo)

    def env(self) -> dict[str, str]:
        return {**os.environ, "LC_ALL": "C", "LANGUAGE": "C", "GIT_TERMINAL_PROMPT": "0"}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        try:
            done = subprocess.run(["git", "-C", str(self.repo), *args], capture_output=True,
                                  text=True, env=self.env(), stdin=subprocess.DEVNULL)
        except OSError as error:
            raise GitError(f"cannot run git: {error}") from None
        if check and done.returncode != 0:
            raise GitError(f"git {' '.join(args)} in {self.repo} failed: "
                           f"{last_line(done.stderr or done.stdout)}")
        return done

    def top_level(self) -> Path:
        """The work tree's root; GitError when repo is not in one."""
        if not self.repo.is_dir():
            raise GitError(f"--repo {self.repo}: no such folder")
        done = self.run("rev-parse", "--show-toplevel", check=False)
        if done.returncode != 0:
            raise GitError(f"--repo {self.repo} is not a git checkout "
                           f"({last_line(done.stderr)})")
        return Path(done.stdout.strip())

    def commit(self, rev: str, option: str = "revision") -> str:
        """The commit sha a revision names; GitError naming the option and the repository."""
        done = self.run("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}",
                        check=False)
        if done.returncode != 0 or not done.stdout.strip():
            raise GitError(f"{option} {rev}: unknown revision in {self.repo}")
        return done.stdout.strip()

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self.run("merge-base", "--is-ancestor", older, newer, check=False).returncode == 0

    def subject(self, sha: str) -> str:
        return self.run("log", "-1", "--format=%s", sha).stdout.strip()

    def head(self) -> Head:
        sha = self.run("rev-parse", "--verify", "HEAD").stdout.strip()
        branch = self.run("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        name = branch.stdout.strip() if branch.returncode == 0 else ""
        return Head(name or None, sha)

    def dirty(self) -> list[str]:
        """What `git status --porcelain` lists: changed tracked files and untracked ones that
        are not ignored (a checkout of another commit could take or mix them)."""
        out = self.run("status", "--porcelain", "--untracked-files=normal").stdout
        return [line[3:] for line in out.splitlines() if line.strip()]

    def git_dir(self) -> Path:
        path = Path(self.run("rev-parse", "--git-dir").stdout.strip())
        return path if path.is_absolute() else self.repo / path

    def bisecting(self) -> bool:
        return (self.git_dir() / "BISECT_START").exists()

    def parents(self, sha: str) -> list[str]:
        return self.run("rev-list", "--parents", "-n", "1", sha).stdout.split()[1:]

    def between(self, good: str, bad: str) -> int:
        """How many commits lie strictly between good and bad (what git bisect can test)."""
        return int(self.run("rev-list", "--count", bad, f"^{good}").stdout) - 1

    def checkout(self, sha: str) -> None:
        self.run("checkout", "--quiet", "--detach", sha)

    def bisect_start(self, bad: str, good: str) -> None:
        self.run("bisect", "start", bad, good, "--")

    def bisect_run_argv(self, command: list[str]) -> list[str]:
        return ["git", "-C", str(self.repo), "bisect", "run", *command]

    def bisect_reset(self) -> None:
        """End the bisect and go back to where it started (the branch, or the detached
        commit)."""
        self.run("bisect", "reset")


def first_bad(output: str) -> str | None:
    """The commit `git bisect run` named as the first bad one, from its output."""
    found = _FIRST_BAD.search(output)
    return found.group(1) if found else None


def candidates(output: str) -> list[str]:
    """The commits git could not tell apart (skipped ones left only), from its output."""
    found = _ANY_OF.search(output)
    return found.group(1).split() if found else []


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
