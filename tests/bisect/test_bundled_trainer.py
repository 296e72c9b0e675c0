"""`python -m harness.bisect` on a temporary git repository of the bundled trainer (a copy of
this project's harness and configs): ten commits, commit 6 planting a one-line bug in the
pipeline's loss (1% too large, on pipeline ranks only), found with the case's own verdict from
real torchrun sessions of the checkout's code."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import INNER_SESSION_ARGS

from .repos import REPO, bisect, commit_ten, git, head, replace_line

PLANTED_AT = 6
ENGINE = "harness/trainer/parallel/engine.py"
PLANT_OLD = "        return self.loss_fn(output, target)\n"
PLANT_NEW = "        return self.loss_fn(output, target) * 1.01\n"
SESSION = ["configs/test_config.json", "--harness-device", "cpu", "--gpus", "2",
           "--harness-var", "ITERATIONS=2", *INNER_SESSION_ARGS]


def plant_pipeline_loss(repo: Path) -> str:
    replace_line(repo / ENGINE, PLANT_OLD, PLANT_NEW)
    return "the pipeline's loss x1.01"


def bundled_trainer_repo(root: Path):
    """The project's tracked harness, configs and pyproject as they are in the work tree."""
    repo = root / "bundled"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "harness", "configs",
                              "pyproject.toml"], capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    (repo / ".gitignore").write_text("__pycache__/\n")
    return commit_ten(repo, {PLANTED_AT: plant_pipeline_loss})


def test_the_planted_commit_of_the_bundled_trainer_is_found(tmp_path):
    commits = bundled_trainer_repo(tmp_path)
    repo = commits.repo
    before = head(repo)
    done = bisect("--repo", str(repo), "--good", commits[0], "--bad", "main", "basic/gpt2/pp2",
                  "--cache", str(tmp_path / "cache"), "--", *SESSION, cwd=tmp_path,
                  timeout=900)
    out = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stdout + done.stderr
    planted = commits[PLANTED_AT]
    assert f"first bad commit: {planted} commit {PLANTED_AT}: the pipeline's loss x1.01" in out
    assert "  basic/gpt2/pp2: the run differs from the single-device reference" in out, out
    # No build command: every commit judged ran one session, none from the cache.
    cost = next(line for line in out if line.startswith("commits judged"))
    judged = int(cost.split()[2])
    assert cost.startswith(f"commits judged: {judged} (0 from the cache, 0 skipped); builds: 0; "
                           f"sessions: {judged}; wall time "), cost
    assert 2 <= judged <= 5, cost  # ten commits, bisected: log2(9) rounds and the ends
    assert head(repo) == before
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "BISECT_START").exists()
