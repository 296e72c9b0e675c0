"""The reference key covers every harness module the trainer process can run.

Planted: the old key hashed only harness/trainer and harness/layout, so a change to the model
contract in harness/contracts (configs, llm.c readers, tied parameters) reused references the old
code had built."""

from __future__ import annotations

import shutil

from harness.launch.trainer_sources import (HARNESS, closure, import_graph, source_digest,
                                           trainer_files)


def test_the_trainer_runs_contracts_layout_and_its_families_and_nothing_of_the_harness_side():
    files = {p.relative_to(HARNESS).as_posix() for p in trainer_files()}
    assert {"trainer/main.py", "contracts/models.py", "contracts/flags.py",
            "contracts/llmc/checkpoint.py", "layout/layout.py",
            "trainer/models/gpt2/parallelize.py"} <= files
    # function-level imports count: a family's TP plan is imported only when TP is asked for
    assert "trainer/parallel/tensor_parallel.py" in files
    assert not {f for f in files if f.startswith(("runner/", "launch/", "report/", "plugin"))}



def test_the_graph_sees_function_level_imports_and_implicit_packages():
    graph = import_graph()
    # multinode.py imports DeviceLeases inside a function
    assert "harness.launch.leases" in graph["harness.launch.multinode"]
    # a family's plan imports harness.trainer.parallel.tensor_parallel, which runs the package
    plan = graph["harness.trainer.models.gpt2.parallelize"]
    assert {"harness.trainer.parallel", "harness.trainer.parallel.tensor_parallel"} <= plan

def test_a_change_in_harness_spec_changes_the_key(tmp_path):
    files = trainer_files()
    copy = tmp_path / "harness"
    for path in files:
        target = copy / path.relative_to(HARNESS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    copied = [copy / p.relative_to(HARNESS) for p in files]
    before = source_digest(copied, root=copy)
    assert before == source_digest(files)  # where the tree lies does not matter
    models = copy / "contracts" / "models.py"
    models.write_text(models.read_text() + "\n# a change\n")
    assert source_digest(copied, root=copy) != before


def test_the_closure_follows_packages_and_stops_at_known_modules():
    assert closure(["harness.nonexistent"]) == set()
    reached = closure(["harness.trainer.main"])
    assert "harness.contracts" in reached and "harness.contracts.models" in reached  # packages run too
    files = {p.relative_to(HARNESS).as_posix() for p in trainer_files()}
    assert {"__init__.py", "trainer/__init__.py", "trainer/__main__.py"} <= files


def test_the_backend_version_changes_with_every_folder_the_trainer_runs(monkeypatch):
    """Planted: `HarnessBackend.version()` hashing the trainer's files less harness/contracts (the
    test above checks `source_digest`, below the key). A change to one file of each folder the
    trainer runs (harness/contracts among them) must change the version, the reference key."""
    from pathlib import Path

    from harness.launch.backends import HarnessBackend

    files = trainer_files()
    before = HarnessBackend().version()
    folders = {p.relative_to(HARNESS).parts[0]: p for p in files if p.parent != HARNESS}
    assert {"contracts", "trainer", "layout"} <= set(folders)
    read_bytes = Path.read_bytes
    for folder, changed in sorted(folders.items()):
        monkeypatch.setattr(Path, "read_bytes", lambda self, changed=changed: read_bytes(self) + (
            b"\n# a change\n" if self == changed else b""))
        assert HarnessBackend().version() != before, f"{changed} ({folder}/) is not in the key"
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert HarnessBackend().version() == before
