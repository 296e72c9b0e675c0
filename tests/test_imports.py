"""Collection, the suggestion tool and the report must start without loading torch; and the
packages keep pyproject.toml's import contract (their layers, no import cycles)."""

import subprocess
import sys

import pytest

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


# ------------------------------------------------------------------------------ the layering
#
# pyproject.toml's import contracts ([tool.importlinter]; `lint-imports` checks the same, and
# .ci/run runs it): the packages form layers, each importing only those below it (packages that
# share a layer import neither each other), and the children of every package, at any depth,
# import each other without a cycle. grimp's graph counts every import statement, at module level,
# inside a function (a deferred import is the same dependency) or under `if TYPE_CHECKING:`.

import grimp  # noqa: E402
from importlinter.api import read_configuration  # noqa: E402
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402

from tests.test_package_maps import PYPROJECT, contract_layers  # noqa: E402

CONTRACT_TYPES = {"layers": LayersContract, "acyclic_siblings": AcyclicSiblingsContract}


def _contracts() -> dict:
    """pyproject.toml's import contracts, by id."""
    config = read_configuration(str(PYPROJECT))
    return {options["id"]: CONTRACT_TYPES[options["type"]](options["name"],
                                                          config["session_options"], options)
            for options in config["contracts_options"]}


def _graph(*planted: tuple[str, str], type_checking: bool = True) -> grimp.ImportGraph:
    graph = grimp.build_graph("harness", cache_dir=None,
                              exclude_type_checking_imports=not type_checking)
    for importer, imported in planted:
        graph.add_import(importer=importer, imported=imported)
    return graph


@pytest.mark.parametrize("contract_id", ["layers", "acyclic"])
def test_the_import_contract_is_kept(contract_id):
    check = _contracts()[contract_id].check(_graph(), verbose=False)
    assert check.kept, f"pyproject.toml's {contract_id!r} import contract is broken (run " \
                       f"lint-imports for the imports that break it): {check.metadata}"


def test_every_package_and_top_level_module_has_a_layer():
    children = {m.rpartition(".")[2] for m in _graph().find_children("harness")}
    placed = [name for layer in contract_layers() for name in layer]
    assert sorted(placed) == sorted(children)


@pytest.mark.parametrize("planted, contract_id", [
    # a lower layer importing a higher one (the issue's: the config's cases reading launch)
    ([("harness.contracts.flags", "harness.runner.settings")], "layers"),
    ([("harness.cases.config_types", "harness.launch.backends")], "layers"),
    # two packages of one layer: neither imports the other
    ([("harness.history.store", "harness.runner.settings")], "layers"),
    ([("harness.registry", "harness.styles")], "layers"),
    # two modules of one package importing each other
    ([("harness.launch.ports", "harness.launch.leases"),
      ("harness.launch.leases", "harness.launch.ports")], "acyclic"),
    # the trainer's models and parallel: only the families' plans may import parallel/
    ([("harness.trainer.models.common", "harness.trainer.parallel.world")], "acyclic"),
])
def test_the_contract_refuses_a_planted_import(planted, contract_id):
    assert not _contracts()[contract_id].check(_graph(*planted), verbose=False).kept


def _back_into_a_package() -> list[str]:
    """What the contracts cannot see: a module that imports a package above it whose __init__
    imports the module back (`from harness.launch import free_port` inside harness/launch/, with
    harness/launch/__init__.py importing that module). Only imports that run count."""
    graph = _graph(type_checking=False)
    found = []
    for module in sorted(graph.modules):
        for package in graph.find_modules_directly_imported_by(module):
            if module.startswith(package + "."):
                chain = graph.find_shortest_chain(importer=package, imported=module)
                if chain:
                    found.append(" -> ".join((module, *chain)))
    return found


def test_no_module_imports_a_package_whose_init_imports_it_back():
    assert not _back_into_a_package()


def test_the_package_check_finds_a_planted_one(monkeypatch):
    build = grimp.build_graph

    def planted(*args, **kwargs):
        graph = build(*args, **kwargs)
        graph.add_import(importer="harness.launch.ports", imported="harness.launch")
        return graph

    monkeypatch.setattr(grimp, "build_graph", planted)
    assert _back_into_a_package() == ["harness.launch.ports -> harness.launch -> "
                                      "harness.launch.ports"]
