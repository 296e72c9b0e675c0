"""Faults through the real plugin and launcher (pytester; the fake trainer backend plays the
faulty trainer, the real trainer where its own behaviour matters). After each: the right status
and message, no process left (by pid), every device lease free, a valid results file holding
every finished case, and a next session that recovers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.plugin.conftest import fake_config, harness_args

from .checks import alive, assert_leases_free, assert_no_process_left, jsonl, results, the_session

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
    assert out.count("Traceback") <= 1  # only the planted one, in the crash's log tail
    assert assert_no_process_left(records) >= len(FAULTS) + 2  # + the hang's and sigkill's children
    assert assert_leases_free(session) == 3  # two slots and the guard
