"""harness.contracts is the torch-free contracts package both sides import (issue 11, item 1):

(a) importing harness.contracts and each of its modules, in a fresh interpreter, loads no torch;
(b) no module under harness/ outside harness/trainer/ imports harness.trainer, at module level,
    inside a function or under TYPE_CHECKING; naming it in a string (the launch command
    `python -m harness.trainer`, the zygote's preload list) is not an import. The other way
    round, the trainer imports no harness-side package (cases, runner, launch, ...): only
    harness.contracts, harness.layout and harness.assets. One exception: harness/trainer/coverage.py,
    the generator of docs/coverage.md, reads the config's cases (harness.cases) to plan each
    with the trainer's own pure planner, and no trainer process runs it;
(c) harness.contracts imports nothing from the rest of harness but harness.layout;
(d) harness/runner and harness/launch name the trainer otherwise only as the module string they
    launch (`python -m harness.trainer`); the zygote also lists the submodules it preloads;
(e) the harness-side packages, imported together in a fresh interpreter, load no torch and no
    trainer module.

The zygote (harness/launch/zygote*.py) pre-warms the trainer on purpose, but only by module-name
strings (PRELOAD, HARNESS_ZYGOTE_ENTRY) handed to importlib.import_module inside the zygote
process, which is the trainer's process, not the harness's: a string mention, so it needs no
exception here. A literal `importlib.import_module("harness.trainer...")` or `__import__` would
count as an import and fail (b).

harness.contracts.models names no torch module at all: a family's module and parallel plan are its
TrainSpec in harness/trainer/models/<family>/, which holds the spec, not the other way round.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness

ROOT = Path(harness.__file__).resolve().parent
CONTRACTS = ROOT / "contracts"
TRAINER = "harness.trainer"
CONTRACTS_MAY_IMPORT = ("harness.contracts", "harness.layout")


def _module_name(path: Path) -> str:
    parts = ["harness", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _contracts_modules() -> list[str]:
    modules = sorted(_module_name(p) for p in CONTRACTS.rglob("*.py"))
    assert modules, f"no module under {CONTRACTS}: the checks below would pass on nothing"
    return modules


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imported_modules(path: Path, text: str | None = None) -> list[tuple[str, int]]:
    """(absolute module, line) of every import in ``path``, wherever it sits (module level,
    functions, classes, TYPE_CHECKING blocks), relative imports resolved; ``from pkg import x``
    gives ``pkg.x`` as well as ``pkg`` (x may be a submodule); literal-string
    ``importlib.import_module`` / ``__import__`` calls count too."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            found.extend((f"{module}.{alias.name}", node.lineno) for alias in node.names
                         if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                found.append((node.args[0].value, node.lineno))
    return found


def test_the_scan_sees_every_kind_of_import():
    text = ("from ..trainer import main\nfrom harness import trainer\n"
            "import harness.trainer.engine as e\nfrom . import ports\n"
            "if TYPE_CHECKING:\n    from harness.trainer.flags import X\n"
            "def f():\n    from harness.trainer.data import y\n"
            "    importlib.import_module('harness.trainer.main')\n"
            "cmd = ['python', '-m', 'harness.trainer']\n")
    hits = sorted({line for module, line in imported_modules(ROOT / "launch" / "x.py", text)
                   if _under(module, TRAINER)})
    assert hits == [1, 2, 3, 6, 8, 9]  # not the string in the launch command (line 10)


# ------------------------------------------------------------------ (b) harness side -> trainer

TRAINER_MAY_IMPORT = ("harness.trainer", "harness.contracts", "harness.layout", "harness.assets")
# The docs generator that plans each config case as the trainer does (its pure plan_parallel):
# it reads the config's cases too.
COVERAGE_TABLE = "trainer/coverage.py"
COVERAGE_TABLE_MAY_IMPORT = ("harness.cases",)


def test_no_module_outside_the_trainer_imports_the_trainer():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "trainer":
            continue
        for module, line in imported_modules(path):
            if _under(module, TRAINER):
                offenders.append(f"harness/{rel.as_posix()}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)


def _imports_beyond(folder: Path, allowed: tuple[str, ...]) -> list[str]:
    """Every import of a harness module, by a module under ``folder``, outside ``allowed``."""
    offenders = []
    for path in sorted(folder.rglob("*.py")):
        for module, line in imported_modules(path):
            if _under(module, "harness") and module != "harness" \
                    and not any(_under(module, a) for a in allowed):
                offenders.append(f"harness/{path.relative_to(ROOT).as_posix()}:{line} "
                                 f"imports {module}")
    return offenders


def test_the_trainer_imports_no_harness_side_package():
    offenders = _imports_beyond(ROOT / "trainer", TRAINER_MAY_IMPORT)
    table = f"harness/{COVERAGE_TABLE}:"
    offenders = [o for o in offenders if not (o.startswith(table) and any(
        _under(o.rpartition(" imports ")[2], a) for a in COVERAGE_TABLE_MAY_IMPORT))]
    assert not offenders, "\n".join(offenders)


def test_no_trainer_process_runs_the_coverage_table():
    from harness.launch.trainer_sources import TRAINER_ENTRIES, closure

    runs = closure(TRAINER_ENTRIES)  # every harness module a trainer process can run
    assert "harness.trainer.main" in runs
    assert not [m for m in runs if _under(m, "harness.trainer.coverage")
                or any(_under(m, a) for a in COVERAGE_TABLE_MAY_IMPORT)]


# ------------------------------------------------------------------ (c) spec is a leaf

def test_spec_imports_only_itself_and_the_layout_from_harness():
    offenders = _imports_beyond(CONTRACTS, CONTRACTS_MAY_IMPORT)
    assert not offenders, "\n".join(offenders)


# ------------------------------------------------------------------ (a) torch-free, for real

_PROBE = """
import importlib, importlib.abc, sys
tried = []
class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            tried.append(name)
        return None
sys.meta_path.insert(0, Recorder())
importlib.import_module(sys.argv[1])
torch = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')
others = sorted(m for m in sys.modules if m.startswith('harness.')
                and not m.startswith(('harness.contracts', 'harness.layout')))
print(torch, tried, others)
"""


def test_the_probe_sees_torch():
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", _PROBE, "harness.trainer.models.gpt2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith("[] []")


@pytest.mark.parametrize("module", _contracts_modules())  # its __init__ included
def test_each_spec_module_loads_no_torch_and_no_other_harness_package(module):
    result = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] [] []", f"{module}: torch loaded, torch tried, " \
                                                f"other harness modules: {result.stdout}"


# ------------------------------------------------------------------ (d) the launch string

def _strings(path: Path) -> list[tuple[str, int]]:
    """Every string constant but docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    return [(n.value, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_runner_and_launch_name_the_trainer_only_as_the_launched_module():
    named = []
    for folder in ("runner", "launch"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for text, line in _strings(path):
                for match in re.finditer(r"harness\.trainer(?:\.\w+)*", text):
                    named.append(match.group(0))
                    # The zygote runs the trainer in-process; trainer_sources reads its
                    # sources for the reference key: both name its entry modules.
                    if path.parent.name == "launch" and (path.name.startswith("zygote") or
                                                         path.name == "trainer_sources.py"):
                        continue
                    assert match.group(0) == TRAINER, (
                        f"harness/{folder}/{path.name}:{line} names {match.group(0)}")
    assert TRAINER in named  # the launch command: python -m harness.trainer


def test_the_trainer_package_init_imports_nothing():
    # So importing a harness.trainer module for the trainer itself runs no other trainer code.
    tree = ast.parse((ROOT / "trainer" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# ------------------------------------------------------------------ (e) the harness side at once

HARNESS_SIDE = ["harness.contracts", "harness.cases", "harness.layout", "harness.launch",
                "harness.runner", "harness.compare", "harness.results", "harness.reference",
                "harness.report", "harness.assets"]


def test_harness_side_packages_load_no_torch_and_no_trainer():
    code = _PROBE.replace("importlib.import_module(sys.argv[1])",
                          "for name in sys.argv[1:]: importlib.import_module(name)")
    code += "print(sorted(m for m in sys.modules if m.startswith('harness.trainer')))\n"
    result = subprocess.run([sys.executable, "-c", code, *HARNESS_SIDE], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("[] [] "), f"torch loaded / tried: {lines[0]}"
    assert lines[1] == "[]", f"trainer modules loaded: {lines[1]}"
