"""Collection, the suggestion tool and the report must start without loading torch."""

import subprocess
import sys

TORCH_FREE = [
    "harness.layout",
    "harness.layout.suggest",
    "harness.cases",
    "harness.compare",
    "harness.results",
    "harness.report",
    "harness.plugin",
    "harness.runner",
    "harness.launch",
    "harness.reference",
    "harness.spec.llmc",
    "harness.trainer.models.configs",
    "harness.assets",
]


def test_harness_modules_import_without_torch():
    code = (
        "import importlib, sys\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'torch' not in sys.modules, name + ' imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_device_settings_without_a_gpu_driver_do_not_load_torch(tmp_path):
    # The controller and every xdist worker resolve `--harness-device auto`; importing torch
    # just to count zero CUDA devices cost ~1.5 s per session (benchmarks/harness_overhead.py).
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from harness.runner.settings import gpu_device_nodes_present, runner_settings\n"
        f"s = runner_settings(Path({str(tmp_path)!r}), Path({str(tmp_path)!r}), 'main', 'auto', "
        "2, 60.0)\n"
        "print(gpu_device_nodes_present(), s.device, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    present, device, torch_loaded = result.stdout.split()
    if present == "False":
        assert (device, torch_loaded) == ("cpu", "False")


# ------------------------------------------------------------------------------ import cycles
#
# An import cycle among harness modules, found by reading the sources (ast), not by importing:
# every import statement counts, at module level or inside a function (a function-level import
# that closes a cycle is the same dependency, only deferred); those under `if TYPE_CHECKING:`
# never run and do not. Importing `a.b.c` also runs the packages `a.b` and `a` unless the
# importer is inside them already, so a package __init__ that imports is part of the graph.

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# Cycles other engineers' files still hold: each entry is the cycle's modules and why it is
# allowed for now. test_the_known_cycles_are_gone is expected to fail while one is there
# (xfail, strict): once it passes, delete the entry.
KNOWN_CYCLES: dict[frozenset, str] = {}


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


def import_graph() -> dict[str, set[str]]:
    """module -> the harness modules its imports run."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
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
        graph[name] = {e for e in edges if e.startswith("harness")}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"harness.a": {"harness.b"}, "harness.b": {"harness.c"}, "harness.c": {"harness.a"},
             "harness.d": {"harness.a"}}
    assert import_cycles(graph) == [frozenset({"harness.a", "harness.b", "harness.c"})]
    assert import_cycles({"harness.a": {"harness.b"}, "harness.b": set()}) == []


def test_the_graph_sees_function_level_imports_and_implicit_packages():
    graph = import_graph()
    # multinode.py imports DeviceLeases inside a function
    assert "harness.launch.leases" in graph["harness.launch.multinode"]
    # a family's plan imports harness.trainer.parallel.tensor_parallel, which runs the package
    plan = graph["harness.trainer.models.gpt2.parallelize"]
    assert {"harness.trainer.parallel", "harness.trainer.parallel.tensor_parallel"} <= plan


def test_no_import_cycles_among_harness_modules():
    cycles = [sorted(c) for c in import_cycles(import_graph()) if c not in KNOWN_CYCLES]
    assert not cycles, f"import cycles: {cycles}"
