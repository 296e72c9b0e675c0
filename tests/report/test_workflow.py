"""The nightly GPU workflow: schema-valid (check-jsonschema's bundled GitHub workflow schema,
offline), every `run:` block valid bash, and the steps the nightly needs are there."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "nightly.yml"


def _load() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict]:
    return _load()["jobs"]["precision"]["steps"]


@pytest.mark.skipif(shutil.which("check-jsonschema") is None,
                    reason="check-jsonschema is not installed (test extra: "
                           "check-jsonschema>=0.28); it validates against its bundled schema")
def test_the_workflow_is_valid_for_github():
    done = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(WORKFLOW)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_run_block_is_valid_bash():
    for step in _steps():
        if "run" in step:
            script = re.sub(r"\$\{\{[^}]*\}\}", "X", step["run"])  # expressions are not bash
            done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
            assert done.returncode == 0, f"{step.get('name')}: {done.stderr}"


def test_triggers_runner_and_the_session():
    workflow = _load()
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    job = workflow["jobs"]["precision"]
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "pip install torch --index-url" in runs and "pip install -e '.[test]'" in runs
    assert re.search(r'pytest configs/test_config.json -m "\$MARKER" --gpus "\$GPUS" -n '
                     r'"\$WORKERS"', runs)
    assert job["env"]["MARKER"].endswith("'pipeline_layout or schedules' }}")
    assert "--harness-output" in runs


def test_report_summary_and_artifacts_run_even_after_failures():
    steps = {s.get("name"): s for s in _steps()}
    report = steps["Report"]
    assert report["if"] == "always()"
    assert "python -m harness.report" in report["run"] and "$GITHUB_STEP_SUMMARY" in report["run"]
    assert "python -m harness.report.artifacts" in report["run"]
    uploads = [s for s in _steps() if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert len(uploads) == 3 and all(s["if"].startswith("always()") for s in uploads)
    assert any("failing-logs" in s["with"]["path"] for s in uploads)


def test_the_history_is_kept_between_nights_and_rendered():
    steps = _steps()
    names = [s.get("name") for s in steps]
    uses = [str(s.get("uses", "")) for s in steps]
    restore = uses.index("actions/cache/restore@v4")
    save = uses.index("actions/cache/save@v4")
    session = names.index("Precision cases")
    assert restore < session < names.index("Report") < save
    # The same folder each way; restored from the newest night's entry, saved as a new one.
    assert steps[restore]["with"]["path"] == steps[save]["with"]["path"] \
        == "${{ env.HARNESS_OUTPUT }}/history"
    assert steps[restore]["with"]["restore-keys"] == "harness-history-"
    assert steps[save]["with"]["key"] == steps[restore]["with"]["key"] \
        == "harness-history-${{ github.run_id }}"
    assert steps[save]["if"].startswith("always()")  # a red night is history too
    report = steps[names.index("Report")]["run"]
    assert '--history "$HARNESS_OUTPUT"' in report  # the report's "Since last week"
    assert 'python -m harness.history "$HARNESS_OUTPUT"' in report
    upload = next(s for s in steps if s.get("name") == "Upload the history")
    assert "history.md" in upload["with"]["path"] and "history.csv" in upload["with"]["path"]
