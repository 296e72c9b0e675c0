"""A HarnessConfig from a schema-valid document: its variables, model files, assets and trainer
here; its cases from expand.py."""

from __future__ import annotations

from pathlib import Path

from .config_types import Assets, HarnessConfig, ModelFiles, TrainerSpec
from .errors import failer_for
from .expand import expand_cases
from .substitution import substitute

DEFAULT_MODELS = ("gpt2", "llama3")


def build_config(path: Path, data: dict) -> HarnessConfig:
    failer = failer_for(path, data)
    variables = dict(data.get("variables", {}))
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

    assets_spec = data.get("assets", {})
    assets = Assets(
        preset=assets_spec.get("preset", "tiny"), seed=assets_spec.get("seed", 0),
        dir=(base_dir / assets_spec["dir"]) if "dir" in assets_spec else None,
    )
    trainer_spec = data.get("trainer", {})
    try:
        trainer = TrainerSpec(
            backend=trainer_spec.get("backend", "harness"),
            command=tuple(substitute(item, variables, failer(["trainer", "command"]))
                          for item in trainer_spec.get("command", ())),
            version=trainer_spec.get("version"),
            env=tuple(sorted(trainer_spec.get("env", {}).items())),
        )
    except ValueError as error:
        failer(["trainer"])(str(error))

    tags, cases = expand_cases(data, variables, models, failer)
    return HarnessConfig(path=path, variables=variables, models=models, model_files=model_files,
                         assets=assets, trainer=trainer, tags=tags, cases=cases)
