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
    "harness.contracts.llmc",
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
        "from harness.runner.settings import Settings, gpu_device_nodes_present\n"
        f"s = Settings.derive(Path({str(tmp_path)!r}), Path({str(tmp_path)!r}), 'main', "
        "device='auto', slots=2, timeout_s=60.0)\n"
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

from harness.launch.trainer_sources import import_graph  # noqa: E402

# Cycles allowed for now, each with why (none since harness.launch.placement ended the last,
# multinode <-> slurm).
KNOWN_CYCLES: dict[frozenset, str] = {}


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
