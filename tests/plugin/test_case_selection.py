"""--harness-cases selects cases by their own tag/model/id, whatever folder the config is in.
`-k` matches substrings of every name in a case's chain: a bare id `1` selects every bfloat16
case (`bfloat16` holds a 1), and where pytest also matches the folders above (issue 48 saw a
clone in `baseline1/` select 54 cases instead of 18) every case of such a checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[1] / "infinitrain" / "data" / "infinitrain_test_config.json"

pytestmark = pytest.mark.subprocess


def _collected(tmp_path: Path, checkout: str, *select: str) -> list[str]:
    """The cases collected from InfiniTrain's config in a checkout folder named `checkout`,
    by a session whose rootdir is another folder (as the test suite's sessions run)."""
    config = tmp_path / checkout / "data" / "test_config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_bytes(CONFIG.read_bytes())
    run = tmp_path / f"run-{checkout}"
    run.mkdir(exist_ok=True)
    (run / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", ".", "-p",
         "no:cacheprovider", "-q", "--collect-only", f"--harness-config={config}",
         "--harness-trainer", "harness", *select],
        cwd=run, capture_output=True, text=True, timeout=120)
    return sorted(line.split("::")[-1] for line in result.stdout.splitlines() if "::" in line)


def test_harness_cases_select_the_same_cases_from_a_checkout_named_x1(tmp_path):
    select = ("--harness-cases=basic/gpt2/1,basic/*/4",)
    plain = _collected(tmp_path, "checkout", *select)
    assert plain == ["basic/gpt2/1", "basic/gpt2/4", "basic/llama3/4"]
    assert _collected(tmp_path, "x1", *select) == plain
    # the trap it replaces: a bare 1 is a substring of more than the id 1
    assert len(_collected(tmp_path, "x1", "-k", "basic and gpt2 and 1")) >= 9
