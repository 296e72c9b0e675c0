"""A HarnessConfig from a schema-valid document: its variables, model files, assets and trainer
here; its cases from expand.py."""

from __future__ import annotations

from pathlib import Path

from harness.contracts.models import MODEL_SPECS

from .config_types import Assets, HarnessConfig, ModelFiles, Overrides, TrainerSpec
from .errors import failer_for
from .expand import expand_cases
from .args import substitute

DEFAULT_MODELS = tuple(MODEL_SPECS)  # every registered model family


def build_config(path: Path, data: dict, overrides: Overrides | None = None) -> HarnessConfig:
    failer = failer_for(path, data)
    overrides = overrides or Overrides()
    variables = {**data.get("variables", {}), **overrides.variables}
    base_dir = path.parent
    models = tuple(data.get("models", DEFAULT_MODELS))

    model_files = {}
    for model, spec in data.get("model_files", {}).items():
        entries = {}
        for role in ("checkpoint", "input_bin"):
            where = ["model_files", model, role]
            text = substitute(spec[role], variables, failer(where))
            if not isinstance(text, str) or not text:
                failer(where)(f"{text!r} is not a file path")
            entries[role] = (base_dir / text) if not Path(text).is_absolute() else Path(text)
        model_files[model] = ModelFiles(**entries)
    for model in models:  # InfiniTrain's scripts name them <MODEL>_LLMC_FILEPATH / _INPUT_BIN
        names = {"checkpoint": f"{model.upper()}_LLMC_FILEPATH",
                 "input_bin": f"{model.upper()}_INPUT_BIN"}
        if model not in model_files and all(variables.get(n) for n in names.values()):
            model_files[model] = ModelFiles(**{
                role: _path(base_dir, str(variables[name])) for role, name in names.items()},
                variables=tuple(names.values()))

    trainer_spec = data.get("trainer", {})
    backend = overrides.backend or trainer_spec.get("backend") or \
        ("infinitrain" if "BUILD_DIR" in variables else "harness")
    assets_spec = data.get("assets", {})
    assets = Assets(
        # InfiniTrain's loaders refuse the tiny preset's files (docs/infinitrain.md)
        preset=assets_spec.get("preset", "infinitrain" if backend == "infinitrain" else "tiny"),
        seed=assets_spec.get("seed", 0),
        dir=(base_dir / assets_spec["dir"]) if "dir" in assets_spec else None,
    )
    build, source = overrides.build_dir, "--infinitrain-build"
    if not build and trainer_spec.get("build"):
        build, source = trainer_spec["build"], "trainer.build"
    if not build and backend == "infinitrain" and variables.get("BUILD_DIR"):
        build, source = variables["BUILD_DIR"], "variable BUILD_DIR"
    try:
        trainer = TrainerSpec(
            backend=backend,
            command=tuple(substitute(item, variables, failer(["trainer", "command"]))
                          for item in trainer_spec.get("command", ())),
            version=trainer_spec.get("version"),
            env=tuple(sorted(trainer_spec.get("env", {}).items())),
            build_dir=_path(base_dir, str(build)) if build else None,
            launch=overrides.launch or trainer_spec.get("launch", "threads"),
            build_source=source,
        )
    except ValueError as error:
        failer(["trainer"])(str(error))

    tags, cases = expand_cases(data, variables, models, failer)
    return HarnessConfig(path=path, variables=variables, models=models, model_files=model_files,
                         assets=assets, trainer=trainer, tags=tags, cases=cases)


def _path(base_dir: Path, text: str) -> Path:
    """A config path: absolute as written, else relative to the config's folder (as
    InfiniTrain's scripts resolve BUILD_DIR from their own folder)."""
    return Path(text) if Path(text).is_absolute() else (base_dir / text)
