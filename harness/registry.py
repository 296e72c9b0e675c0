"""The registry: launcher names and trainer backend names, each to where its implementation is.

Entries are "module:attribute" strings, imported on first use (`resolve`), so importing this
module (the config loader does, for the backend names) imports no launcher, no backend and no
torch. It imports no harness package either: it sits below both the config's cases
(harness.cases: a config's `trainer.backend`, the schema's enum) and the launchers and backends
that it names (harness.launch), which both read their names here (pyproject.toml's import
contract, docs/design.md).

- LAUNCHERS: name -> a class of the Launcher protocol (harness.launch.launcher), made with no
  arguments; `--harness-launcher` and Settings.launcher name one
  (harness.launch.backends.registered_launcher makes it).
- TRAINER_BACKENDS: name -> a factory `(config: HarnessConfig, facts_dir: Path | None) ->
  TrainerBackend` (harness.launch.backends.backend_factory finds it); a config's
  `trainer.backend` and `--harness-trainer` name one.

Adding one is a module of its own and one line here (docs/design.md, "Adding a launcher",
"Adding a trainer backend"); a test registers its own with monkeypatch.setitem on these dicts.
"""

from __future__ import annotations

import importlib

LAUNCHERS: dict[str, str] = {
    "torchrun": "harness.launch.torchrun:TorchrunLauncher",
    "zygote": "harness.launch.zygote:ZygoteLauncher",
}
TRAINER_BACKENDS: dict[str, str] = {
    "harness": "harness.launch.backends:HarnessBackend.from_config",
    "command": "harness.launch.backends:CommandBackend.from_config",
    "infinitrain": "harness.launch.infinitrain:InfiniTrainBackend.from_config",
}


def launcher_names() -> tuple[str, ...]:
    return tuple(LAUNCHERS)


def backend_names() -> tuple[str, ...]:
    return tuple(TRAINER_BACKENDS)


def resolve(table: dict[str, str], name: str, what: str):
    """The object `table` registers as `name`, imported now: a ValueError naming the choices
    when there is no such entry, or naming the entry when it cannot be imported."""
    if name not in table:
        raise ValueError(f"{what} {name!r} is not registered; expected one of "
                         f"{', '.join(table)} (harness.registry)")
    module, _, path = table[name].partition(":")
    try:
        found = importlib.import_module(module)
        for part in path.split("."):  # "Class.factory": a classmethod
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{what} {name!r}: {table[name]!r} cannot be imported ({error}); "
                         f"expected 'module:attribute' of an importable module") from None
    return found
