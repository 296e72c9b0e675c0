"""Package maps that cannot go stale: every package whose __init__ docstring lists its modules
(`    name.py   what it holds`) lists exactly the modules present, and docs/design.md's package
map names only modules that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
LISTED = re.compile(r"^\s{2,}(\w+\.py)\b", re.M)


def _maps():
    for init in sorted(HARNESS.rglob("__init__.py")):
        text = ast.get_docstring(ast.parse(init.read_text()), clean=False) or ""
        listed = set(LISTED.findall(text))
        if listed:
            yield pytest.param(init.parent, listed, id=str(init.parent.relative_to(ROOT)))


# Packages whose __init__ must hold a module map (docs/design.md says so).
MAPPED = ("cases", "runner", "report")


def test_the_mapped_packages_keep_their_maps():
    mapped = {p.values[0].name for p in _maps()}
    assert not set(MAPPED) - mapped, f"no module map in the __init__ of {set(MAPPED) - mapped}"


@pytest.mark.parametrize("package, listed", list(_maps()))
def test_init_map_lists_every_module(package, listed):
    present = {p.name for p in package.glob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert not listed - present, f"{package}: the map lists modules that do not exist"
    assert not present - listed, f"{package}: modules missing from the __init__ map"


def _design_map() -> dict[Path, set[str]]:
    """docs/design.md's package map: each entry's folder, and the names it mentions."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Package map", 1)[1].split("\n\n", 2)[1]
    entries: dict[Path, set[str]] = {}
    stack: list[tuple[int, Path]] = []
    current = None
    for line in block.splitlines():
        match = re.match(r"^( *)([\w.]+/?)( +|$)(.*)", line)
        if match and len(match.group(1)) <= 2 * (len(stack) + 2) and \
                (match.group(2).endswith(("/", ".py"))) and len(match.group(1)) % 2 == 0 \
                and len(match.group(1)) < 14:
            indent, name = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ROOT
            path = parent / name.rstrip("/")
            if name.endswith("/"):
                stack.append((indent, path))
            current = path
            entries[path] = set()
            rest = match.group(4)
        else:
            rest = line
        if current is not None:
            entries[current] |= set(re.findall(r"(?<![\w/])(\w+\.py|\w+/)(?![\w/])", rest))
    return entries


def test_design_doc_package_map_is_complete_and_true():
    entries = _design_map()
    listed = set(entries) | {(p if p.is_dir() else p.parent) / n.rstrip("/")
                             for p, names in entries.items() for n in names}
    packages = {p.parent for p in HARNESS.rglob("__init__.py")}
    unlisted = sorted(str(p.relative_to(ROOT)) for p in packages - listed)
    assert not unlisted, f"docs/design.md's package map lacks packages: {unlisted}"
    top = {p for p in HARNESS.glob("*.py") if p.name != "__init__.py"}
    assert not top - listed, f"docs/design.md's package map lacks {sorted(top - listed)}"
    for path, names in entries.items():
        assert path.exists(), f"docs/design.md's package map lists {path}, which does not exist"
        folder = path if path.is_dir() else path.parent
        missing = sorted(n for n in names if not (folder / n.rstrip("/")).exists())
        assert not missing, f"docs/design.md: {path.relative_to(ROOT)} names {missing}, " \
                            f"which do not exist there"
