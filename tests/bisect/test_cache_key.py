"""The bisect's verdict cache is keyed on everything a verdict depends on (issue 48): a step
that differs from a cached one in only its commit, build command, test arguments, case or
threshold is a miss, runs the case again and does not return the cached verdict; the same step
again is a hit. Driven through `harness.bisect.step.judge` (Spec.key -> cache.key ->
VerdictCache), its build and session faked in process.

Planted by hand, each failing a test of this file (issue 48): every part of the key left out of
Spec.key (step.py, "" or None passed in its place), and out of cache.key's hashed facts."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from harness.bisect import step
from harness.bisect.step import Spec
from harness.bisect.verdict import BAD, GOOD, Verdict

SHA = "a" * 40


def _spec(tmp_path, **changes) -> Spec:
    base = Spec(repo=str(tmp_path / "repo"), case="t/gpt2/pp2",
                test_args=["cases.json", "--gpus", "2"], build="make", threshold=None,
                cache=str(tmp_path / "cache"), steps_log=str(tmp_path / "steps.jsonl"),
                timeout_s=60.0, python="python")
    return dataclasses.replace(base, **changes)


@pytest.fixture
def ran(monkeypatch):
    """Every session and build judge starts, faked: each session's verdict line is its own
    ("session N: ..."), so a verdict served from the cache is told from a fresh one."""
    sessions, builds = [], []

    def run_case(repo, test_args, case, threshold, run_dir, timeout_s, python):
        sessions.append((list(test_args), case, threshold))
        outcome = BAD if len(sessions) % 2 else GOOD
        verdict = Verdict(outcome, f"session {len(sessions)}: {case} {outcome}")
        return verdict, SimpleNamespace(duration_s=0.5)

    def run_process(argv, env, timeout_s, stdout, stderr, cwd=None):
        builds.append(argv[-1])
        return SimpleNamespace(timed_out=False, returncode=0, duration_s=0.25, stdout=stdout,
                               stderr=stderr)

    monkeypatch.setattr(step, "run_case", run_case)
    monkeypatch.setattr(step, "run_process", run_process)
    return SimpleNamespace(sessions=sessions, builds=builds)


# Each variant differs from the base step (commit SHA, `_spec(tmp_path)`) in one part of the key.
VARIANTS = {
    "commit": ("b" * 40, {}),
    "build-command": (SHA, {"build": "make -j2"}),
    "build-none": (SHA, {"build": None}),
    "test-args-added": (SHA, {"test_args": ["cases.json", "--gpus", "2",
                                            "--harness-baseline", "pytorch"]}),
    "test-args-order": (SHA, {"test_args": ["--gpus", "2", "cases.json"]}),
    "case": (SHA, {"case": "t/gpt2/pp2-vpp2"}),
    "threshold-given": (SHA, {"threshold": {"kind": "slower-than", "value": 1000.0}}),
}


@pytest.mark.parametrize("part", sorted(VARIANTS))
def test_a_step_that_differs_in_one_part_of_the_key_is_a_miss(tmp_path, ran, part):
    sha, changes = VARIANTS[part]
    first = step.judge(_spec(tmp_path), SHA, "subject")
    assert not first["cached"] and len(ran.sessions) == 1

    other = step.judge(_spec(tmp_path, **changes), sha, "subject")
    assert not other["cached"], f"{part}: the first step's cached verdict was served " \
                                f"({other['line']!r}): the key leaves out {part}"
    assert len(ran.sessions) == 2 and other["line"] == "session 2: " + \
        f"{changes.get('case', 't/gpt2/pp2')} {other['outcome']}", part
    assert other["outcome"] != first["outcome"], part
    assert other["run_dir"] != first["run_dir"], f"{part}: the two steps share a run folder"

    # both are kept: each is found again under its own key, with its own verdict
    for spec, commit, expected in ((_spec(tmp_path), SHA, first),
                                   (_spec(tmp_path, **changes), sha, other)):
        again = step.judge(spec, commit, "subject")
        assert again["cached"], part
        assert (again["outcome"], again["line"]) == (expected["outcome"], expected["line"]), part
    assert len(ran.sessions) == 2, part


THRESHOLDS = {
    "threshold-value": ({"kind": "slower-than", "value": 1000.0},
                        {"kind": "slower-than", "value": 999.0}),
    "threshold-kind": ({"kind": "slower-than", "value": 1000.0},
                       {"kind": "memory-above", "value": 1000.0}),
}


@pytest.mark.parametrize("part", sorted(THRESHOLDS))
def test_a_step_under_another_threshold_is_a_miss(tmp_path, ran, part):
    one, two = THRESHOLDS[part]
    first = step.judge(_spec(tmp_path, threshold=one), SHA, "subject")
    other = step.judge(_spec(tmp_path, threshold=two), SHA, "subject")
    assert not first["cached"] and not other["cached"], f"{part}: the key leaves it out"
    assert [s[2] for s in ran.sessions] == [step.Threshold(**one), step.Threshold(**two)]
    assert other["line"] != first["line"], part


def test_the_same_step_again_is_a_hit_with_the_first_verdict(tmp_path, ran):
    threshold = {"kind": "memory-above", "value": 512.0}
    first = step.judge(_spec(tmp_path, threshold=threshold), SHA, "first subject")
    # an equal spec (fresh lists and dicts) and another subject line: the key is the same
    again = step.judge(_spec(tmp_path, threshold=dict(threshold),
                             test_args=["cases.json", "--gpus", "2"]), SHA, "reworded")
    assert not first["cached"] and again["cached"]
    assert (again["outcome"], again["line"]) == (first["outcome"], first["line"])
    assert again["subject"] == "reworded" and not again["built"] and not again["session"]
    assert len(ran.sessions) == 1 and ran.builds == ["make"]


def test_the_key_of_a_spec_is_the_cache_key_of_its_parts(tmp_path):
    """Spec.key hands every part to cache.key, each in its own place."""
    from harness.bisect.cache import key

    threshold = {"kind": "slower-than", "value": 10.0}
    spec = _spec(tmp_path, threshold=threshold)
    assert spec.key(SHA) == key(SHA, "make", ["cases.json", "--gpus", "2"], "t/gpt2/pp2",
                                threshold)
