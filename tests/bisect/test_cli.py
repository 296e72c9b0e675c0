"""`python -m harness.bisect` on a temporary git repository of a foreign trainer (tests/plugin's
fake trainer through the command backend): ten commits, one planting a loss bug that only a
multi-rank run has, one whose build fails, one without the case. The tool is run as a user runs
it, from another folder; the checkout is checked before and after."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from harness.launch.reaper import descendants
from tests.reliability.checks import alive

from .repos import (BROKEN_AT, FAKE_SESSION, MISSING_AT, PLANTED_AT, bisect, fake_trainer_repo,
                    git, head, start_bisect)

BUILD = ["--build", "test ! -f BROKEN"]


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_untouched(repo: Path, before: tuple[str, str]) -> None:
    assert head(repo) == before
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "BISECT_START").exists()


def test_the_planted_commit_is_found_and_a_second_bisect_is_all_from_the_cache(tmp_path):
    commits = fake_trainer_repo(tmp_path)
    repo, cache = commits.repo, tmp_path / "cache"
    before = head(repo)

    def range_(good: str, bad: str) -> list[str]:
        return ["--repo", str(repo), "--good", good, "--bad", bad, "fake/gpt2/pp2",
                "--cache", str(cache), *BUILD, "--", *FAKE_SESSION]

    args = range_(commits[0], "main")

    first = bisect(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    out = lines(first.stdout)
    planted = commits[PLANTED_AT]
    assert f"first bad commit: {planted} commit {PLANTED_AT}: the loss of a multi-rank run " \
           "is off by 0.01" in out
    assert "  fake/gpt2/pp2: the run differs from the single-device reference" in out
    assert any("first diverging step 1: got 4.885, reference 4.875" in line for line in out)
    # The skipped commits, each said once with why.
    assert f"skipped {commits[BROKEN_AT][:12]} 'commit {BROKEN_AT}: BROKEN added': the build " \
           "failed (exit 1): no output" in out
    assert f"skipped {commits[MISSING_AT][:12]} 'commit {MISSING_AT}: BROKEN removed, " \
           "fake/gpt2/pp2 renamed away': fake/gpt2/pp2 does not exist at this commit (nothing collected)" in out
    # git looked at 4 and 5 (both skipped), 7 and 8; the case's session ran where it built.
    cost = next(line for line in out if line.startswith("commits judged"))
    assert cost.startswith("commits judged: 4 (0 from the cache, 2 skipped); builds: 4; "
                           "sessions: 3; wall time "), cost
    assert out[-1] == f"checkout restored: main at {before[1][:12]} (git bisect reset)"
    assert_untouched(repo, before)
    progress = lines(first.stderr)  # one verdict line per commit judged
    assert len(progress) == 4 and all(p.startswith("harness.bisect: ") for p in progress)
    assert f"harness.bisect: {planted[:12]} 'commit {PLANTED_AT}: the loss of a multi-rank " \
           "run is off by 0.01': bad: fake/gpt2/pp2: the run differs" in first.stderr

    second = bisect(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [l for l in lines(second.stdout) if not l.startswith("commits judged")] == \
        [l for l in out if not l.startswith("commits judged")]
    cost = next(line for line in lines(second.stdout) if line.startswith("commits judged"))
    assert cost.startswith("commits judged: 4 (4 from the cache, 2 skipped); builds: 0; "
                           "sessions: 0;"), cost
    assert lines(second.stderr) and all(l.endswith("[from the cache]")
                                        for l in lines(second.stderr))
    assert_untouched(repo, before)

    # The range's ends, which git takes on trust, are judged when the answer rests on them.
    bad_is_good = bisect(*range_(commits[6], commits[7]), cwd=tmp_path)
    assert bad_is_good.returncode == 1
    assert f"--bad {commits[7]} ({commits[7][:12]}) is good: fake/gpt2/pp2: passed; nothing " \
           "in the range fails" in lines(bad_is_good.stdout)
    good_is_bad = bisect(*range_(planted, "main"), cwd=tmp_path)
    assert good_is_bad.returncode == 1
    assert any(l.startswith(f"--good {planted} ({planted[:12]}) is bad too: fake/gpt2/pp2: the "
                            "run differs from the single-device reference; the case fails "
                            "there already") for l in lines(good_is_bad.stdout)), good_is_bad.stdout
    assert "builds: 1; sessions: 1;" in good_is_bad.stdout  # commit 9 only; 8 is cached
    assert_untouched(repo, before)


def test_bad_input_is_one_line_and_touches_nothing(tmp_path):
    commits = fake_trainer_repo(tmp_path)
    repo = commits.repo
    before = head(repo)
    common = ["--repo", str(repo), "--cache", str(tmp_path / "cache")]

    def refused(*args: str) -> str:
        done = bisect(*common, *args, "--", *FAKE_SESSION, cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout == "" and len(lines(done.stderr)) == 1, done.stderr
        assert head(repo) == before and not (repo / ".git" / "BISECT_START").exists()
        return done.stderr.strip()

    assert refused("--good", commits[9], "--bad", commits[0], "fake/gpt2/pp2") == (
        f"harness.bisect: --good {commits[9]} ({commits[9][:12]}) is not an ancestor of --bad "
        f"{commits[0]} ({commits[0][:12]}) in {repo}: the good commit must be in the bad one's "
        "history")
    assert refused("--good", "no-such-rev", "--bad", "main", "fake/gpt2/pp2") == (
        f"harness.bisect: --good no-such-rev: unknown revision in {repo}")
    assert refused("--good", commits[0], "--bad", "v9", "fake/gpt2/pp2") == (
        f"harness.bisect: --bad v9: unknown revision in {repo}")
    assert refused("--good", "main", "--bad", commits[9], "fake/gpt2/pp2") == (
        f"harness.bisect: --good main and --bad {commits[9]} are the same commit "
        f"{commits[9][:12]} in {repo}")
    assert refused("--good", commits[0], "--bad", "main", "pp2") == (
        "harness.bisect: case 'pp2': expected TAG/MODEL/ID, e.g. basic/llama3/1")
    assert refused("--good", commits[0], "--bad", "main", "--repo", str(tmp_path / "nowhere"),
                   "fake/gpt2/pp2") == f"harness.bisect: --repo {tmp_path / 'nowhere'}: no such folder"

    # A dirty checkout is refused, never stashed: the change is still there after.
    (repo / "trainer.py").write_text((repo / "trainer.py").read_text() + "# mine\n")
    (repo / "scratch.txt").write_text("untracked\n")
    assert refused("--good", commits[0], "--bad", "main", "fake/gpt2/pp2") == (
        f"harness.bisect: the checkout {repo} has uncommitted changes (trainer.py, scratch.txt): "
        "commit or remove them first; harness.bisect checks out other commits and stashes "
        "nothing")
    assert (repo / "trainer.py").read_text().endswith("# mine\n")
    git(repo, "checkout", "--", "trainer.py")
    (repo / "scratch.txt").unlink()

    git(repo, "bisect", "start", "main", commits[0])  # the user's own bisect, left alone
    mid = head(repo)
    done = bisect(*common, "--good", commits[0], "--bad", "main", "fake/gpt2/pp2", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", (
        f"harness.bisect: a bisect is already in progress in {repo} (end it with "
        "`git bisect reset` first)\n"))
    assert head(repo) == mid and (repo / ".git" / "BISECT_START").exists()
    git(repo, "bisect", "reset")
    assert head(repo) == before


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_ctrl_c_ends_the_running_step_and_restores_the_checkout(tmp_path):
    """SIGINT while a commit's session runs a case that hangs (the fake trainer sleeps, with a
    child in a session of its own): every process the tool started is gone, by pid, the
    checkout is back where it was and the interrupted commit has no verdict in the cache."""
    commits = fake_trainer_repo(tmp_path)
    repo, cache, records = commits.repo, tmp_path / "cache", tmp_path / "records"
    records.mkdir()
    before = head(repo)
    tool = start_bisect("--repo", str(repo), "--good", commits[0], "--bad", "main",
                        "fake/gpt2/hang", "--cache", str(cache), "--", *FAKE_SESSION,
                        cwd=tmp_path, env={"FAKE_RECORD_DIR": str(records)})
    try:
        pids_file = records / "pids.jsonl"
        _wait_for(lambda: pids_file.is_file() and any(
            json.loads(l).get("child") for l in pids_file.read_text().splitlines()), 120,
            "the hanging case's child")
        assert git(repo, "rev-parse", "HEAD") == commits[4]  # git's first pick: mid-bisect
        started = descendants(tool.pid)  # git, the step, the session, the trainer, its child
        hanging = {r["pid"] for r in map(json.loads, pids_file.read_text().splitlines())
                   if r["case"] == "fake/gpt2/hang"}  # the case's trainer and its child
        assert len(hanging) == 2 and hanging <= set(started), (started, hanging)
        assert len(started) >= 6, started
        tool.send_signal(signal.SIGINT)
        out, err = tool.communicate(timeout=60)
    finally:
        if tool.poll() is None:
            tool.kill()
    assert tool.returncode == 130, out + err
    assert out == ""
    assert lines(err)[-1] == (
        "harness.bisect: interrupted (SIGINT) after 0 commits: the running step's processes "
        f"were ended; checkout restored: main at {before[1][:12]} (git bisect reset)")
    left = [pid for pid in started if alive(pid)]
    assert left == [], left
    assert_untouched(repo, before)
    assert not list((cache / "verdicts").glob("*.json"))  # nothing half-judged was kept
