"""Import rules: the contracts (harness.spec.flags) and the config loader (harness.cases) load
no torch, and the harness side does not pull the trainer in.

The rule as the code keeps it (checked below by reading every file with `ast`):

- No module outside harness/trainer/ imports a trainer module at import time. The file formats
  the harness reads and writes itself (llm.c files, run records) live in harness.spec, so
  TORCH_FREE_TRAINER_MODULES and IMPORT_TIME_SITES are empty; a new site is a decision to
  make, not an accident, so it fails here (tests/spec/test_contracts.py has the strict rule).
- Imports deferred into a function follow the same allowlist, except in
  harness/launch/zygote*.py, whose job is to load the trainer (it does so by module-name
  strings, inside the zygote process).
- harness/runner and harness/launch name the trainer otherwise only as the module string
  "harness.trainer" they launch (`python -m harness.trainer`); the zygote also lists the
  submodules it preloads.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import harness

ROOT = Path(harness.__file__).resolve().parent
TRAINER = "harness.trainer"
TORCH_FREE_TRAINER_MODULES: set[str] = set()  # the formats moved to harness.spec (issue 11)
# (file relative to harness/, trainer module) imported at import time, as the code has them.
IMPORT_TIME_SITES: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = ["harness", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _harness_side_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not p.relative_to(ROOT).parts[0] == "trainer")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, text: str | None = None) -> list[tuple[str, bool, int]]:
    """(imported module, at import time?, line) for every import of a harness.trainer
    module in `path` (absolute or relative, `from harness import trainer` too)."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool, int]] = []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module in ("harness", TRAINER):  # `from harness.trainer import llmc`: the submodule
            return [f"{module}.{alias.name}" for alias in node.names]
        return [module]

    def visit(node, import_time: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(stmt, import_time)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, import_time, child.lineno) for t in targets(child)
                             if t == TRAINER or t.startswith(TRAINER + "."))
            else:
                visit(child, import_time)

    visit(tree, True)
    return found


@functools.lru_cache(maxsize=None)
def _harness_side_imports() -> tuple[tuple[Path, tuple[tuple[str, bool, int], ...]], ...]:
    return tuple((path, tuple(_imports(path))) for path in _harness_side_files())


def _allowed(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in TORCH_FREE_TRAINER_MODULES)


def test_the_scan_sees_relative_and_package_imports():
    text = ("from ..trainer import main\nfrom harness import trainer\n"
            "import harness.trainer.engine as e\nfrom . import ports\n"
            "if TYPE_CHECKING:\n    from harness.trainer.main import X\n"
            "def f():\n    from harness.trainer.llmc import read_tokens\n")
    assert _imports(ROOT / "launch" / "x.py", text) == [("harness.trainer.main", True, 1), ("harness.trainer", True, 2),
                              ("harness.trainer.engine", True, 3),
                              ("harness.trainer.llmc", False, 8)]


def test_no_import_time_trainer_imports_beyond_the_torch_free_sites():
    sites = set()
    for path, imports in _harness_side_imports():
        for module, import_time, line in imports:
            if import_time:
                rel = path.relative_to(ROOT).as_posix()
                assert _allowed(module), f"harness/{rel}:{line} imports {module} at import time"
                sites.add((rel, module))
    assert sites == IMPORT_TIME_SITES


def test_deferred_trainer_imports_are_torch_free_outside_the_zygote():
    for path, imports in _harness_side_imports():
        if path.parent.name == "launch" and path.name.startswith("zygote"):
            continue
        for module, import_time, line in imports:
            rel = path.relative_to(ROOT).as_posix()
            assert _allowed(module), f"harness/{rel}:{line} imports {module}"


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
                    if path.parent.name == "launch" and path.name.startswith("zygote"):
                        continue
                    assert match.group(0) == TRAINER, (
                        f"harness/{folder}/{path.name}:{line} names {match.group(0)}")
    assert TRAINER in named  # the launch command: python -m harness.trainer


def test_the_trainer_package_init_imports_nothing():
    # So importing a harness.trainer module for the trainer itself runs no other trainer code.
    tree = ast.parse((ROOT / "trainer" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# ------------------------------------------------------------------ in a fresh interpreter

_RECORDER = """
import importlib.abc, sys
tried = []
class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            tried.append(name)
        return None
sys.meta_path.insert(0, Recorder())
"""


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", _RECORDER + code], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_flags_and_cases_load_no_torch():
    out = _run("import harness.spec.flags, harness.cases\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'), tried)\n")
    assert out == "[] []"  # not loaded, not even tried


def test_flags_alone_loads_no_trainer_and_no_torch():
    out = _run("import harness.spec.flags\n"
               "print(sorted(m for m in sys.modules if m.startswith(('torch', 'harness.trainer'))),"
               " tried)\n")
    assert out == "[] []"


def test_harness_side_packages_load_only_the_torch_free_trainer_modules():
    packages = ["harness.spec", "harness.cases", "harness.layout", "harness.launch",
                "harness.runner", "harness.compare", "harness.results", "harness.reference",
                "harness.report", "harness.assets"]
    out = _run(f"import importlib\nfor name in {packages!r}: importlib.import_module(name)\n"
               "print(tried)\n"
               "print(' '.join(sorted(m for m in sys.modules if m.startswith('harness.trainer'))))")
    tried, _, loaded = out.partition("\n")
    assert tried == "[]"
    for module in loaded.split():
        assert module == TRAINER or _allowed(module), module
