"""The test tiers are declared (tests/tiers.py), not guessed: every test file is declared or
carries its own tier mark, every declaration names a file and a test that exist, and a test
that is neither fails with what to add."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import _evaluate, declared_tier
from tests.tiers import MODULES, TESTS, TIERS, selects_none_of_ours

ROOT = Path(__file__).resolve().parents[1]
OWN_MARK = re.compile(rf"^pytestmark = pytest\.mark\.({'|'.join(TIERS)})\b", re.M)


def _test_names(path: Path) -> set[str]:
    """The test functions of a file, methods as Class::name."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)}
    return {n for n in names if n.rpartition("::")[2].startswith("test")}


def test_every_test_file_is_declared_or_marks_itself():
    undeclared = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                        if str(p.relative_to(ROOT)) not in MODULES
                        and not OWN_MARK.search(p.read_text()) and _test_names(p))
    assert not undeclared, f"test files with no tier in tests/tiers.py: {undeclared}"


def test_every_declaration_names_a_file_and_a_test_that_exist():
    assert set(MODULES.values()) | set(TESTS.values()) <= set(TIERS)
    missing = sorted(m for m in MODULES if not (ROOT / m).is_file())
    assert not missing, f"tests/tiers.py declares files that do not exist: {missing}"
    stale = sorted(t for t in TESTS if t.partition("::")[2]
                   not in _test_names(ROOT / t.partition("::")[0]))
    assert not stale, f"tests/tiers.py declares tests that do not exist: {stale}"


def test_a_test_is_declared_by_name_before_its_file_and_without_its_parameters():
    assert declared_tier("tests/layout/test_solver.py::test_solver_matches_brute_force[3-2]") \
        == "heavy"
    assert declared_tier("tests/layout/test_solver.py::test_something_new") == "unit"
    assert declared_tier("configs/test_config.json::basic/gpt2/pp2") == "torchrun"
    assert declared_tier("tests/nowhere/test_new.py::test_x") is None


def _pytest(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:harness", "-p",
                           "no:cacheprovider", "--rootdir", str(folder), str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_an_undeclared_test_fails_naming_what_to_add(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_runtest_setup  "
        "# noqa: F401\n")
    (tmp_path / "test_new.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "test_tagged.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.unit, pytest.mark.pipeline_layout]\n\n"
        "def test_y():\n    pass\n")
    result = _pytest(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 errors" in result.stdout
    # a config tag on a test of ours: `-m pipeline_layout` would no longer skip tests/ exactly
    assert ("test_tagged.py::test_y carries the mark(s) pipeline_layout: a test of ours carries "
            "only ") in result.stdout
    assert ("test_new.py::test_x has no tier: add 'test_new.py' to MODULES in tests/tiers.py "
            "(or the test to TESTS), or mark it with one of unit, heavy, subprocess, torchrun, "
            "gpu") in result.stdout
    (tmp_path / "test_new.py").write_text("import pytest\n\npytestmark = pytest.mark.unit\n\n"
                                          "def test_x():\n    pass\n")
    (tmp_path / "test_tagged.py").unlink()
    result = _pytest(tmp_path)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


def test_a_mark_expression_selects_none_of_ours_only_when_no_tier_and_mark_set_matches():
    none = [e for e in ("pipeline_layout", "basic or pipeline_layout", "harness",
                        "schedules and not slow", "not unit and not heavy and not subprocess "
                        "and not torchrun and not gpu", "unit and basic")
            if selects_none_of_ours(e, _evaluate)]
    assert len(none) == 6, none
    some = [e for e in ("", "unit", "not unit", "slow", "not basic", "torchrun or basic",
                        "parametrize", "not (pipeline_layout)", "gpu and skipif")
            if not selects_none_of_ours(e, _evaluate)]
    assert len(some) == 9, some


def test_the_main_job_collects_the_config_alone():
    """`-m pipeline_layout` from the repository collects exactly what naming the config does:
    no module of tests/ is imported (7 s of the job's collection before)."""
    def collect(*args):
        return subprocess.run([sys.executable, "-m", "pytest", *args, "-m", "pipeline_layout",
                               "--gpus", "8", "--collect-only", "-q", "-p", "no:cacheprovider"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    main, config = collect(), collect("configs/test_config.json")
    assert main.returncode == 0, main.stdout + main.stderr
    assert main.stdout.splitlines()[-1].split(" in ")[0] == \
        config.stdout.splitlines()[-1].split(" in ")[0], (main.stdout[-500:], config.stdout[-500:])
    assert "tests/" not in main.stdout and "pipeline_layout/gpt2/pp2-uniform" in main.stdout
