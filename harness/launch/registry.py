"""The registry: launcher names and trainer backend names, each to where its implementation is.

Entries are "module:attribute" strings, imported on first use, so importing this module (the
config loader does, for the backend names) imports no launcher, no backend and no torch.

- LAUNCHERS: name -> a class of the Launcher protocol (harness.launch.launcher), made with no
  arguments; `--harness-launcher` and Settings.launcher name one.
- TRAINER_BACKENDS: name -> a factory `(config: HarnessConfig, facts_dir: Path | None) ->
  TrainerBackend` (harness.launch.backends); a config's `trainer.backend` and
  `--harness-trainer` name one.

Adding one is a module of its own and one line here (docs/design.md, "Adding a launcher",
"Adding a trainer backend"); a test registers its own with monkeypatch.setitem on these dicts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pathlib import Path

    from harness.cases import HarnessConfig

    from .backends import TrainerBackend
    from .launcher import Launcher

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


def launcher(name: str) -> Launcher:
    """The launcher registered as `name`, made afresh (a launcher holds no run's state)."""
    return _resolve(LAUNCHERS, name, "launcher")()


def backend_factory(name: str) -> Callable[[HarnessConfig, Path | None], TrainerBackend]:
    """The factory of the trainer backend registered as `name`."""
    return _resolve(TRAINER_BACKENDS, name, "trainer backend")


def _resolve(table: dict[str, str], name: str, what: str):
    if name not in table:
        raise ValueError(f"{what} {name!r} is not registered; expected one of "
                         f"{', '.join(table)} (harness.launch.registry)")
    module, _, path = table[name].partition(":")
    try:
        found = importlib.import_module(module)
        for part in path.split("."):  # "Class.factory": a classmethod
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{what} {name!r}: {table[name]!r} cannot be imported ({error}); "
                         f"expected 'module:attribute' of an importable module") from None
    return found
