"""docs/slurm.md's nightly workflow, run against the one-node Slurm of the tests: its matrix
step (the pytest command, then the report into the step summary) and its cancel step, which
must end what a cancelled nightly leaves in the queue.

The workflow's shell is GitHub's (`bash -eo pipefail`); what this machine cannot be is
changed by the substitutions below, each of which must still match the docs (so an edit there
cannot pass unnoticed): a 2-core runner, the test cluster's partition, two cases of the matrix.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.launch.process import signal_group

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "slurm.md"
SUBSTITUTIONS = {  # as written in the docs -> for this machine's one-node cluster
    "-n 16": "-n 2",
    "--partition=gpu --qos=nightly": "--partition=harness",
    "--harness-timeout 1800": "--harness-timeout 300",
    ". .venv/bin/activate": "true",
}
CASE = "configs/test_config.json::pipeline_layout/gpt2/pp2-uniform"


def _steps() -> dict[str, str]:
    text = DOC.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    workflow = yaml.safe_load(block)
    (job,) = workflow["jobs"].values()
    return {step["name"]: step.get("run", "") for step in job["steps"] if "name" in step}


def _script(name: str) -> str:
    script = _steps()[name]
    for documented, here in SUBSTITUTIONS.items():
        if documented in script:
            script = script.replace(documented, here)
    return script


def _env(slurm, tmp_path) -> dict[str, str]:
    env = {**os.environ, **{k: v for k, v in slurm.env.items() if k.startswith("SLURM")}}
    env.update(HARNESS_OUTPUT=str(tmp_path / "nightly"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"),
               USER=getpass.getuser(), PYTEST_ADDOPTS=f"{CASE} -p no:cacheprovider",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return env


def test_the_documented_substitutions_still_match_the_docs():
    steps = _steps()
    matrix = steps["the matrix, one Slurm job per case"]
    for documented in SUBSTITUTIONS:
        assert documented in matrix, f"docs/slurm.md's matrix step no longer has {documented!r}"
    assert "scancel" in steps["cancel what is left if the workflow is cancelled"]


@pytest.mark.slow
def test_the_nightly_runs_and_its_cancel_step_leaves_no_job(slurm, tmp_path):
    env = _env(slurm, tmp_path)
    matrix = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _script(
        "the matrix, one Slurm job per case")]
    done = subprocess.run(matrix, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    assert "pipeline_layout/gpt2/pp2-uniform" in summary, summary[:2000]
    assert slurm.jobs() == []

    # The same nightly again, cancelled while its jobs are queued or running: the cancel step.
    running = subprocess.Popen(matrix, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not slurm.jobs():
            assert running.poll() is None, running.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no job was submitted"
            time.sleep(0.2)
        cancel = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                 _script("cancel what is left if the workflow is cancelled")],
                                env=env, capture_output=True, text=True, timeout=60)
        assert cancel.returncode == 0, cancel.stderr
        deadline = time.monotonic() + 30
        while slurm.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slurm.jobs() == [], f"left in the queue: {slurm.jobs()}"
    finally:
        # the workflow's own cancel: SIGTERM to the step's processes (bash and its pytest)
        signal_group(running.pid, signal.SIGTERM)
        out, _ = running.communicate(timeout=300)
    assert slurm.jobs() == []
    assert "was cancelled (not by the harness" in out or "terminated by SIGTERM" in out, out[-3000:]
