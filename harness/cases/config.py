"""Load configs/test_config.json: JSON Schema validation, @VAR@ substitution, semantic checks,
InfiniTrain flag mapping and case expansion, with every error as one line that names the file,
the case and the field, the value, and what was expected.

No torch, no pytest: `load_config(path)` returns a HarnessConfig whose `cases` are the expanded
(tag, case, model) triples in file order, so every pytest-xdist worker sees the same list.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from .schema import ARG_TYPES, SCHEMA

DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_MODELS = ("gpt2", "llama3")
# atol per dtype (InfiniTrain's loss thresholds); rtol 0 unless configured.
DEFAULT_ATOL = {"float32": 1e-5, "bfloat16": 1e-2}

# Flags the harness sets itself for every run; a case may not set them.
HARNESS_OWNED = {
    "model": "list the model in `models`",
    "llmc_filepath": "set `model_files.<model>.checkpoint`",
    "input_bin": "set `model_files.<model>.input_bin`",
    "device": "use --harness-device",
    "output_dir": "the harness gives every run its own folder",
    "dump_gradients": "the harness dumps gradients when `compare.gradients` is true",
    "profile_layers": "not a precision-test setting",
}
# InfiniTrain flags (scripts/test_config.json) our trainer does not implement: a case using one
# is collected and skipped with the reason, so their whole file loads.
INFINITRAIN_ONLY = frozenset({
    "zero_stage", "use_distributed_optimizer", "lr_decay_style", "min_lr", "lr_warmup_iters",
    "lr_warmup_init", "lr_decay_iters", "activation_recompute", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "lora_rank", "lora_alpha",
    "lora_target_modules", "save", "load", "save_interval", "save_optimizer_state",
    "max_checkpoint_keep", "global_batch_size", "micro_batch_size", "flash", "llmc_filepath_val",
    "input_val_bin", "val_loss_every", "sample_every", "overfit_single_batch", "grad_clip",
    "num_threads",
})
# Defaults of the hyper-parameters every case resolves (the trainer's own defaults).
TRAINER_DEFAULTS = {
    "dtype": "float32", "batch_size": 4, "sequence_length": 64, "num_iteration": 10,
    "learning_rate": 1e-4, "weight_decay": 0.0, "optimizer": "sgd", "seed": 42,
    "tensor_parallel": 1, "sequence_parallel": False, "pipeline_parallel": 1,
    "virtual_pipeline_parallel": 1,
}
# Flags that define the single-device reference (with the model and its files).
REFERENCE_FLAGS = ("dtype", "batch_size", "sequence_length", "total_batch_size", "num_iteration",
                   "learning_rate", "weight_decay", "optimizer", "seed")
_INT_FLAGS = {n for n, t in ARG_TYPES.items() if "integer" in t["type"]}
_NUM_FLAGS = {n for n, t in ARG_TYPES.items() if "number" in t["type"]}
_BOOL_FLAGS = {n for n, t in ARG_TYPES.items() if "boolean" in t["type"]}
_VAR = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")


class ConfigError(ValueError):
    """A bad test config; str() is one line naming the file, the case and the field."""


# --------------------------------------------------------------------------- value types

@dataclass(frozen=True)
class Tolerance:
    """Pass when |got - ref| <= atol + rtol * |ref|, element-wise."""

    atol: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} is {value!r}; expected a finite number >= 0")

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol}

    def __str__(self) -> str:
        return f"atol={self.atol:g} rtol={self.rtol:g}"


@dataclass(frozen=True)
class Tolerances:
    loss: Tolerance
    gradients: Tolerance

    def to_dict(self) -> dict:
        return {"loss": self.loss.to_dict(), "gradients": self.gradients.to_dict()}


@dataclass(frozen=True)
class Compare:
    loss: bool = True
    gradients: bool = True

    def __post_init__(self) -> None:
        if not (self.loss or self.gradients):
            raise ValueError("compares nothing; expected `loss` or `gradients` to be true")

    def to_dict(self) -> dict:
        return {"loss": self.loss, "gradients": self.gradients}


@dataclass(frozen=True)
class ModelFiles:
    """A model's checkpoint and token file; both None means the built-in synthetic assets."""

    checkpoint: Path | None = None
    input_bin: Path | None = None

    @property
    def synthetic(self) -> bool:
        return self.checkpoint is None


@dataclass(frozen=True)
class Assets:
    preset: str = "tiny"
    seed: int = 0
    dir: Path | None = None


@dataclass(frozen=True)
class TrainerSpec:
    """Which trainer runs the cases: ours (`harness`) or a command template (`command`)."""

    backend: str = "harness"
    command: tuple[str, ...] = ()
    version: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in ("harness", "command"):
            raise ValueError(f"backend is {self.backend!r}; expected 'harness' or 'command'")
        if self.backend == "command" and not self.command:
            raise ValueError("backend 'command' needs a `command` template (a list of strings)")


@dataclass(frozen=True)
class Case:
    """One (tag, case, model): what a pytest item runs."""

    tag: str
    case_id: str
    model: str
    flags: dict[str, Any]  # trainer flags (resolved hyper-parameters + the case's own)
    world_size: int
    tolerances: Tolerances
    compare: Compare
    source: str  # e.g. "test_groups[1].tests[3]"
    description: str = ""
    # InfiniTrain-only flags (name -> value): our trainer skips the case; a command backend
    # gets them passed through.
    extra_flags: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        need = self.pp * self.tp
        if self.world_size < 1 or self.world_size % need:
            raise ValueError(f"world size {self.world_size} is not a multiple of "
                             f"tensor_parallel * pipeline_parallel = {need}")

    @property
    def name(self) -> str:
        """The pytest name: `tag/model/id`, stable and readable."""
        return f"{self.tag}/{self.model}/{self.case_id}"

    @property
    def pp(self) -> int:
        return int(self.flags.get("pipeline_parallel", 1))

    @property
    def tp(self) -> int:
        return int(self.flags.get("tensor_parallel", 1))

    @property
    def vpp(self) -> int:
        return int(self.flags.get("virtual_pipeline_parallel", 1))

    @property
    def dp(self) -> int:
        return self.world_size // (self.pp * self.tp)

    @property
    def unsupported(self) -> tuple[str, ...]:
        return tuple(self.extra_flags)

    def reference_flags(self) -> dict[str, Any]:
        """The flags of this case's single-device reference run."""
        return {name: self.flags[name] for name in REFERENCE_FLAGS if name in self.flags}


@dataclass(frozen=True)
class HarnessConfig:
    path: Path
    variables: dict[str, Any]
    models: tuple[str, ...]
    model_files: dict[str, ModelFiles]
    assets: Assets
    trainer: TrainerSpec
    tags: tuple[str, ...]
    cases: tuple[Case, ...]

    def files_for(self, model: str) -> ModelFiles:
        return self.model_files.get(model, ModelFiles())


# --------------------------------------------------------------------------- loading

def read_tags(path: str | Path) -> list[str]:
    """The tags of a config, best effort (for marker registration before collection); a file
    that cannot be read gives [] here and its error at collection."""
    try:
        data = json.loads(Path(path).read_text())
        return [g["tag"] for g in data.get("test_groups", [])
                if isinstance(g, dict) and isinstance(g.get("tag"), str)
                and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", g["tag"])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def load_config(path: str | Path) -> HarnessConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the test config: {error.strerror or error}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: invalid JSON at line {error.lineno} column {error.colno}: "
                          f"{error.msg}") from None
    except ValueError as error:
        raise ConfigError(f"{path}: invalid JSON: {error}") from None
    _validate_schema(path, data)
    return _build(path, data)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _where(data: Any, location: list) -> str:
    """'tag 'basic', case 'pp2', field args.batch_size' for a JSON path into the config."""
    parts = []
    rest = list(location)
    if len(rest) >= 2 and rest[0] == "test_groups" and isinstance(rest[1], int):
        group = _get(data, ["test_groups", rest[1]])
        tag = group.get("tag") if isinstance(group, dict) else None
        parts.append(f"tag {tag!r}" if isinstance(tag, str) else f"test_groups[{rest[1]}]")
        rest = rest[2:]
        if len(rest) >= 2 and rest[0] == "tests" and isinstance(rest[1], int):
            test = _get(group, ["tests", rest[1]])
            case_id = test.get("id") if isinstance(test, dict) else None
            parts.append(f"case {case_id!r}" if isinstance(case_id, str)
                         else f"tests[{rest[1]}]")
            rest = rest[2:]
    if rest:
        parts.append("field " + _dotted(rest))
    return ", ".join(parts) if parts else "top level"


def _dotted(location: list) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _get(data: Any, location: list) -> Any:
    for part in location:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _validate_schema(path: Path, data: Any) -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    error = best_match(validator.iter_errors(data))
    if error is None:
        _check_names(path, data)
        return
    location = list(error.absolute_path)
    value = error.instance
    kind = error.validator
    if kind == "additionalProperties" and isinstance(value, dict):
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(known))
        problem = (f"unknown key {extra[0]!r}" if extra else "unknown key") + \
            (f"; expected one of: {', '.join(known)}" if known else "")
    elif kind == "required":
        missing = [key for key in error.validator_value if key not in value]
        problem = f"missing required key {missing[0]!r}"
    elif kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        problem = f"{value!r} is not of type {expected}"
    elif kind == "enum":
        problem = f"{value!r} is not one of {', '.join(map(repr, error.validator_value))}"
    elif kind == "pattern":
        problem = f"{value!r} does not match the pattern {error.validator_value!r}"
    elif kind in ("minimum", "exclusiveMinimum"):
        problem = f"{value!r} is below the minimum {error.validator_value!r}"
    elif kind == "minItems":
        problem = f"{value!r} needs at least {error.validator_value} item(s)"
    elif kind == "uniqueItems":
        problem = f"{value!r} has repeated items"
    else:
        problem = error.message
    if error.absolute_schema_path and "propertyNames" in error.absolute_schema_path:
        problem = f"key {value!r} does not match the pattern {error.validator_value!r}"
    raise ConfigError(f"{path}: {_where(data, location)}: {problem}")


def _check_names(path: Path, data: dict) -> None:
    """Tags and case ids become marker names and folder names: match their schema patterns in
    full. (jsonschema searches with Python's `re`, whose `$` also matches before a final
    newline, so "ok\n" would pass the schema alone.)"""
    group_schema = SCHEMA["properties"]["test_groups"]["items"]
    tag_pattern = group_schema["properties"]["tag"]["pattern"]
    id_pattern = group_schema["properties"]["tests"]["items"]["properties"]["id"]["pattern"]
    for g, group in enumerate(data["test_groups"]):
        checks = [(["test_groups", g, "tag"], group["tag"], tag_pattern)]
        checks += [(["test_groups", g, "tests", t, "id"], test["id"], id_pattern)
                   for t, test in enumerate(group["tests"])]
        for location, value, pattern in checks:
            if not re.fullmatch(pattern.rstrip("$"), value):
                raise ConfigError(f"{path}: {_where(data, location)}: {value!r} does not match "
                                  f"the pattern {pattern!r}")


def _substitute(value: Any, variables: dict, fail) -> Any:
    """@VAR@ string substitution (no evaluation). A string that is exactly "@VAR@" takes the
    variable's value with its JSON type, so "@BATCH@" can stand for a number."""
    if not isinstance(value, str):
        return value
    whole = _VAR.fullmatch(value)
    if whole:
        name = whole.group(1)
        if name not in variables:
            fail(f"undefined variable @{name}@ in {value!r}; defined: "
                 f"{', '.join(sorted(variables)) or 'none'}")
        return variables[name]

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in variables:
            fail(f"undefined variable @{name}@ in {value!r}; defined: "
                 f"{', '.join(sorted(variables)) or 'none'}")
        item = variables[name]
        return ("true" if item else "false") if isinstance(item, bool) else str(item)

    return _VAR.sub(replace, value)


def _coerce(name: str, value: Any, fail) -> Any:
    """The typed value of one trainer flag (after substitution)."""
    if name in _BOOL_FLAGS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        fail(f"{value!r} is not a boolean; expected true or false")
    if name in _INT_FLAGS:
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"{value!r} is not an integer")
        if name != "seed" and value <= 0:
            fail(f"{value!r} is not a positive integer")
        if name == "seed" and not -(2**63) <= value <= 2**64 - 1:
            fail(f"{value!r} is out of range; expected an integer from -2**63 to 2**64-1")
        return value
    if name in _NUM_FLAGS:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                fail(f"{value!r} is not a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            fail(f"{value!r} is not a finite number >= 0")
        return float(value)
    if name == "dtype" and value not in DTYPES:
        fail(f"{value!r} is not one of {', '.join(DTYPES)}")
    if name == "optimizer" and value not in OPTIMIZERS:
        fail(f"{value!r} is not one of {', '.join(OPTIMIZERS)}")
    if name == "pipeline_schedule":
        from harness.trainer.flags import SCHEDULES  # plain module, no torch

        if value not in SCHEDULES:
            fail(f"{value!r} is not one of {', '.join(SCHEDULES)}")
    if not isinstance(value, str):
        fail(f"{value!r} is not a string")
    return value


def _tolerance(base: Tolerance, override: dict | None) -> Tolerance:
    if not override:
        return base
    return Tolerance(override.get("atol", base.atol), override.get("rtol", base.rtol))


def _tolerances(base: Tolerances, override: dict | None) -> Tolerances:
    if not override:
        return base
    return Tolerances(_tolerance(base.loss, override.get("loss")),
                      _tolerance(base.gradients, override.get("gradients")))


def _compare(base: Compare, override: dict | None, fail) -> Compare:
    if not override:
        return base
    try:
        return Compare(override.get("loss", base.loss), override.get("gradients", base.gradients))
    except ValueError as error:
        fail(str(error))


def _build(path: Path, data: dict) -> HarnessConfig:
    def failer(location: list):
        def fail(problem: str):
            raise ConfigError(f"{path}: {_where(data, location)}: {problem}")
        return fail

    variables = dict(data.get("variables", {}))
    base_dir = path.parent
    models = tuple(data.get("models", DEFAULT_MODELS))

    model_files = {}
    for model, spec in data.get("model_files", {}).items():
        entries = {}
        for role in ("checkpoint", "input_bin"):
            where = ["model_files", model, role]
            text = _substitute(spec[role], variables, failer(where))
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
            command=tuple(_substitute(item, variables, failer(["trainer", "command"]))
                          for item in trainer_spec.get("command", ())),
            version=trainer_spec.get("version"),
            env=tuple(sorted(trainer_spec.get("env", {}).items())),
        )
    except ValueError as error:
        failer(["trainer"])(str(error))

    default_tolerances = {}
    for dtype in DTYPES:
        base = Tolerances(Tolerance(DEFAULT_ATOL[dtype]), Tolerance(DEFAULT_ATOL[dtype]))
        default_tolerances[dtype] = _tolerances(base, data.get("tolerances", {}).get(dtype))
    top_compare = _compare(Compare(), data.get("compare"), failer(["compare"]))
    top_defaults = data.get("defaults", {})

    tags: list[str] = []
    cases: list[Case] = []
    seen: dict[tuple[str, str], str] = {}
    for g, group in enumerate(data["test_groups"]):
        tag = group["tag"]
        if tag not in tags:
            tags.append(tag)
        group_compare = _compare(top_compare, group.get("compare"),
                                 failer(["test_groups", g, "compare"]))
        for t, test in enumerate(group["tests"]):
            where = ["test_groups", g, "tests", t]
            source = f"test_groups[{g}].tests[{t}]"
            key = (tag, test["id"])
            if key in seen:
                failer(where + ["id"])(f"duplicate case id {test['id']!r} in tag {tag!r} "
                                       f"(also {seen[key]}); ids must be unique within a tag")
            seen[key] = source
            flags, world_size, unsupported = _resolve_args(
                [(["defaults"], top_defaults),
                 (["test_groups", g, "defaults"], group.get("defaults", {})),
                 (where + ["args"], test.get("args", {}))],
                variables, failer)
            dtype = flags["dtype"]
            tolerances = _tolerances(
                _tolerances(default_tolerances[dtype], group.get("tolerances")),
                test.get("tolerances"))
            compare = _compare(group_compare, test.get("compare"), failer(where + ["compare"]))
            for model in test.get("models", group.get("models", models)):
                cases.append(Case(
                    tag=tag, case_id=test["id"], model=model, flags=dict(flags),
                    world_size=world_size, tolerances=tolerances, compare=compare,
                    source=source, description=test.get("description", ""),
                    extra_flags=dict(unsupported),
                ))
    return HarnessConfig(path=path, variables=variables, models=models, model_files=model_files,
                         assets=assets, trainer=trainer, tags=tuple(tags), cases=tuple(cases))


def _resolve_args(layers, variables, failer):
    """Merge defaults < group defaults < case args; substitute, type, map InfiniTrain flags.
    Returns (trainer flags, world size, InfiniTrain-only flag names)."""
    merged: dict[str, tuple[Any, list]] = {}
    for location, args in layers:
        for name, value in args.items():
            merged[name] = (value, location + [name])
    flags: dict[str, Any] = dict(TRAINER_DEFAULTS)
    unsupported: dict[str, Any] = {}
    data_parallel = nthreads = None
    for name, (raw, location) in merged.items():
        fail = failer(location)
        if name in HARNESS_OWNED:
            fail(f"is set by the harness, not by a case: {HARNESS_OWNED[name]}")
        if name in INFINITRAIN_ONLY:
            unsupported[name] = _substitute(raw, variables, fail)
            continue
        if name not in ARG_TYPES:
            fail(f"unknown trainer flag {name!r}; expected one of: {', '.join(sorted(ARG_TYPES))}")
        value = _coerce(name, _substitute(raw, variables, fail), fail)
        if name == "data_parallel":
            data_parallel = (value, location)
        elif name == "nthread_per_process":
            nthreads = (value, location)
        else:
            flags[name] = value
    model_parallel = flags["tensor_parallel"] * flags["pipeline_parallel"]
    last_location = next(iter(merged.values()))[1][:-1] if merged else layers[-1][0]
    if nthreads is not None:
        world = nthreads[0]
        if world % model_parallel:
            failer(nthreads[1])(
                f"{world} processes is not a multiple of tensor_parallel * pipeline_parallel = "
                f"{flags['tensor_parallel']} * {flags['pipeline_parallel']} = {model_parallel}")
        if data_parallel is not None and data_parallel[0] * model_parallel != world:
            failer(data_parallel[1])(
                f"data_parallel {data_parallel[0]} * tensor_parallel * pipeline_parallel "
                f"{model_parallel} != nthread_per_process {world}")
    else:
        world = (data_parallel[0] if data_parallel else 1) * model_parallel
    dp = world // model_parallel
    per_pass = flags["batch_size"] * flags["sequence_length"] * dp
    if "total_batch_size" not in flags:
        flags["total_batch_size"] = per_pass
    elif flags["total_batch_size"] % per_pass:
        location = merged.get("total_batch_size", (None, last_location + ["total_batch_size"]))[1]
        failer(location)(
            f"{flags['total_batch_size']} is not a multiple of batch_size * sequence_length * "
            f"data-parallel size = {flags['batch_size']} * {flags['sequence_length']} * {dp} "
            f"= {per_pass}")
    return flags, world, unsupported
