"""Faults through the real plugin and launcher (pytester; the fake trainer backend plays the
faulty trainer, the real trainer where its own behaviour matters). After each: the right status
and message, no process left (by pid), every device lease free, a valid results file holding
every finished case, and a next session that recovers."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plugin.conftest import fake_config, harness_args

from .checks import (
    assert_leases_free,
    assert_no_process_left,
    interrupt_when,
    jsonl,
    results,
    the_session,
)

FAULTS = {  # case id -> (status, what the failure text says)
    "ok": ("passed", None),
    "crash": ("failed", "the run failed: rank 1 of 2 failed first; exit code 3"),
    "hang": ("failed", "the run failed: timed out after 2 s (--harness-timeout); every process"),
    "sigkill": ("failed", "the run failed: killed by signal SIGKILL"),
    "nan": ("failed", "loss is not finite (NaN / inf) at step(s) 2"),
    "inf-grad": ("failed", "1 elements are NaN / inf in the run"),
    "missing-grad": ("failed", "gradients: 1 missing from the run: h.1.mlp.c_fc.weight"),
    "extra-grad": ("failed", "gradients: 1 not in the reference: h.9.bogus.weight"),
    "corrupt-grad": ("failed", "gradients: h.3.mlp.c_fc.weight: the run's gradient file cannot be read"),
}


def test_every_fault_is_reported_and_cleaned_up(pytester, harness_dir, records):
    harness_dir(fake_config([{"id": i, "args": {"pipeline_parallel": 2}} for i in FAULTS]))
    result = pytester.runpytest(*harness_args(pytester, "--harness-timeout", "2", "--gpus", "2"))
    result.assert_outcomes(passed=1, failed=len(FAULTS) - 1)
    session = the_session(pytester.path / "out")
    by_name = results(session)
    assert sorted(by_name) == sorted(f"fake/gpt2/{i}" for i in FAULTS)
    out = result.stdout.str()
    for case_id, (status, text) in FAULTS.items():
        record = by_name[f"fake/gpt2/{case_id}"]
        assert record["status"] == status, (case_id, record["reason"])
        if text:
            assert text in "\n".join(record["errors"]), (case_id, record["errors"])
            assert f"fake/gpt2/{case_id}: " in out
        print(f"{case_id}: {record['status']}: {record['reason']}")
    assert by_name["fake/gpt2/sigkill"]["returncode"] == -signal.SIGKILL
    assert by_name["fake/gpt2/hang"]["timed_out"] is True
    # Only the planted one, in the crash's log tail (the short summary repeats whole messages
    # when CI is set, so it is cut off first).
    assert out.split("short test summary info")[0].count("Traceback") == 1
    assert assert_no_process_left(records) >= len(FAULTS) + 2  # + the hang's and sigkill's children
    assert assert_leases_free(session) == 3  # two slots and the guard


def _entry(cache):
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1, entries
    return entries[0]


def _damage_gradient(entry):
    victim = sorted((entry / "gradients").glob("*.npy"))[3]
    victim.write_bytes(b"\0" * victim.stat().st_size)  # same size, other bytes


def _half_written(entry):
    """A build killed before its rename: the entry gone, a partial scratch folder left."""
    scratch = entry.parent / f".{entry.name}.tmp-99999-deadbeef"
    shutil.copytree(entry, scratch)
    (scratch / "COMPLETE.json").unlink()
    shutil.rmtree(entry)


DAMAGES = {
    "a gradient file's bytes changed": _damage_gradient,
    "steps.jsonl cut in half": lambda e: (e / "steps.jsonl").write_text(
        (e / "steps.jsonl").read_text()[:40]),
    "completion marker missing": lambda e: (e / "COMPLETE.json").unlink(),
    "completion marker is junk": lambda e: (e / "COMPLETE.json").write_text("{"),
    "half-written build (scratch folder, no entry)": _half_written,
}


def test_a_damaged_reference_cache_entry_is_rebuilt_not_trusted(pytester, harness_dir, records):
    harness_dir(fake_config([{"id": "ok", "args": {}}]))
    cache = pytester.path / "cache"

    def session(n):
        # Each session its own output (in-process sessions within one second share a name),
        # all of them one reference cache.
        output = pytester.path / f"out{n}"
        result = pytester.runpytest(*harness_args(pytester), "--harness-output", str(output),
                                    "--harness-reference-cache", str(cache))
        result.assert_outcomes(passed=1)
        return results(the_session(output))["fake/gpt2/ok"]

    session(1)
    assert len(jsonl(records / "references.jsonl")) == 1
    for n, (what, damage) in enumerate(DAMAGES.items(), start=2):
        damage(_entry(cache))
        assert session(n)["reference"]["built"] is True, what  # rebuilt, not trusted
        assert len(jsonl(records / "references.jsonl")) == n, what
    # And an intact entry is reused.
    assert session(len(DAMAGES) + 2)["reference"]["built"] is False
    assert len(jsonl(records / "references.jsonl")) == len(DAMAGES) + 1
    assert_no_process_left(records)


def test_a_truncated_checkpoint_is_refused_by_the_real_trainer(pytester, tiny_assets):
    """Our own trainer, so its own check is what speaks: the reference run exits 2 with one
    line naming the file; every case of that model errors without running it again."""
    data = tiny_assets.checkpoint("gpt2").read_bytes()
    (pytester.path / "cut.bin").write_bytes(data[: len(data) // 2])
    config = {"models": ["gpt2"],
              "model_files": {"gpt2": {"checkpoint": "cut.bin",
                                       "input_bin": str(tiny_assets.tokens("gpt2", "train"))}},
              "test_groups": [{"tag": "cut", "tests": [{"id": "a", "args": {}},
                                                       {"id": "b", "args": {}}]}]}
    (pytester.path / "cases.json").write_text(json.dumps(config))
    result = pytester.runpytest(*harness_args(pytester, "--gpus", "1"))
    result.assert_outcomes(errors=0, failed=2)
    session = the_session(pytester.path / "out")
    by_name = results(session)
    for name in ("cut/gpt2/a", "cut/gpt2/b"):
        record = by_name[name]
        assert record["status"] == "error"
        assert "the reference failed: exit code 2" in record["errors"][0]
        assert f"error: {pytester.path / 'cut.bin'}" in record["errors"][0]
        assert "truncated" in record["errors"][0]
    assert len(list((session / "reference-failures").glob("*.txt"))) == 1  # once, not per case
    # Every file the failure text names still exists: the build's own folder is gone, its
    # logs are kept beside the text.
    named = re.findall(r"(/\S+/logs/\S+)", by_name["cut/gpt2/a"]["errors"][0])
    assert named and all(Path(p.rstrip(")")).is_file() for p in named), named
    assert not [p for p in (pytester.path / "out" / "reference-cache").iterdir()
                if not p.name.endswith(".lock")]  # nothing cached
    assert "Traceback" not in result.stdout.str()
    assert_leases_free(session)


def _finished(pytester, case: str) -> bool:
    return any(r["name"] == f"fake/gpt2/{case}"
               for r in jsonl(next((pytester.path / "out" / "sessions").glob("*/results.jsonl"),
                                   pytester.path / "none")))


AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")


@pytest.mark.parametrize("sent, workers", [(signal.SIGINT, 0), (signal.SIGTERM, 0),
                                           (signal.SIGTERM, 2)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-n2"])
def test_sigint_mid_case_ends_the_run_and_keeps_finished_results(pytester, harness_dir, records,
                                                                  sent, workers):
    """Ctrl-C, and SIGTERM (what `timeout` sends, what CI escalates to), handled alike; under
    xdist the signal goes to the controller alone, as `timeout` sends it."""
    hangs = ("hang", "hang-too") if workers else ("hang",)
    harness_dir(fake_config([{"id": "ok", "args": {}}, *({"id": h, "args": {}} for h in hangs),
                             {"id": "after", "args": {}}]))
    # The session starts as from a terminal, SIGINT at its default. A process started in the
    # background by a non-interactive shell (as CI runners start `.ci/run`) inherits SIGINT
    # *ignored*, and Python keeps an ignored SIGINT ignored: Ctrl-C would then never reach it.
    xdist = ["-n", str(workers)] if workers else []
    command = [sys.executable, "-c", AS_FROM_A_TERMINAL, sys.executable, "-m", "pytest",
               *harness_args(pytester, "--harness-timeout", "120", *xdist)]
    session_process = subprocess.Popen(command, cwd=pytester.path, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    # Generous bounds: this is about what an interrupt leaves, not how fast. On a loaded
    # 2-core CI machine (two xdist workers, each with its own sessions) ending the run and
    # writing the report once took over 60 s.
    out = interrupt_when(session_process, lambda: {
        r["case"].rsplit("/", 1)[1] for r in jsonl(records / "pids.jsonl")
        if r.get("child")} >= set(hangs) and _finished(pytester, "ok"), sent)
    assert "KeyboardInterrupt" in out
    session = the_session(pytester.path / "out")
    by_name = results(session)
    assert by_name["fake/gpt2/ok"]["status"] == "passed"
    assert not set(by_name) & {f"fake/gpt2/{h}" for h in hangs}
    if not workers:
        assert "fake/gpt2/after" not in by_name
    assert_no_process_left(records)
    assert_leases_free(session)
    # The next session recovers: the reference built before the interrupt is reused.
    result = pytester.runpytest(*harness_args(pytester, "-k", "ok or after"))
    result.assert_outcomes(passed=2)
    assert all(r["reference"]["built"] is False for r in results(the_session(pytester.path / "out")).values())


def test_pytest_killed_leaves_no_process_behind(pytester, harness_dir, records):
    """SIGKILL to pytest runs no handler at all: the run's reaper dies with its parent
    (PR_SET_PDEATHSIG) and ends the run's processes, each checked by pid."""
    harness_dir(fake_config([{"id": "ok", "args": {}}, {"id": "hang", "args": {}}]))
    session_process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *harness_args(pytester, "--harness-timeout", "120")],
        cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not any(r.get("child") for r in jsonl(records / "pids.jsonl")):
            assert time.monotonic() < deadline, "the hang case never started"
            assert session_process.poll() is None
            time.sleep(0.1)
    finally:
        session_process.kill()
        session_process.wait()
    assert_no_process_left(records, within_s=20)
    session = the_session(pytester.path / "out")
    assert results(session)["fake/gpt2/ok"]["status"] == "passed"  # what finished is kept
    assert_leases_free(session)
