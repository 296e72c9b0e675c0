"""The files the bundled trainer runs, found from its sources: the reference cache's key.

The key of a reference must change whenever code the trainer process runs changes: the trainer,
and everything it imports from harness (model contracts in harness.contracts, layouts, assets
readers...). Hashing two hand-picked folders missed harness/contracts. The set is found by reading
the sources (ast), not by importing them: every import statement counts, at module level or
inside a function (a function-level import runs too, only later, e.g. a family's TP plan),
those under `if TYPE_CHECKING:` do not, and importing `a.b.c` also runs the packages `a.b` and
`a`. Reading is torch-free and takes ~0.1 s; importing would miss the function-level imports.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1]
# What a trainer process starts from: `python -m harness.trainer` (which runs the packages
# harness and harness.trainer first) and the zygote's `main(argv)`.
TRAINER_ENTRIES = ("harness", "harness.trainer", "harness.trainer.__main__", "harness.trainer.main")


def _module_name(path: Path) -> str:
    parts = ["harness", *path.relative_to(HARNESS).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST):
    """Every import statement of the tree outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _with_packages(target: str, importer: str) -> set[str]:
    """``target`` and the packages above it that importing it runs (those not above the
    importer, which are running already)."""
    parts = target.split(".")
    above_importer = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    return {m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            if m in MODULES and m not in above_importer and m != importer}


def imports_of(name: str) -> set[str]:
    """The harness modules that importing module `name` runs."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges |= _with_packages(alias.name, name)
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            submodule = f"{module}.{alias.name}"
            if submodule in MODULES:
                edges |= _with_packages(submodule, name)
            elif module in MODULES and module != name:
                edges.add(module)  # a name from the module: it must have run to there
                edges |= _with_packages(module, name)
    return {e for e in edges if e.startswith("harness")}


def import_graph() -> dict[str, set[str]]:
    """module -> the harness modules its imports run, for every harness module."""
    return {name: imports_of(name) for name in MODULES}


def closure(entries) -> set[str]:
    """Every module that importing the entries can run, the entries included (only those
    modules' sources are read)."""
    seen, stack = set(), [e for e in entries if e in MODULES]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(imports_of(module) - seen)
    return seen


def trainer_files() -> list[Path]:
    """The source files of every harness module the trainer process can run, sorted."""
    return sorted(MODULES[m] for m in closure(TRAINER_ENTRIES))


def source_digest(paths: list[Path], root: Path = HARNESS) -> str:
    """A digest of the files' paths (relative to root) and bytes."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
