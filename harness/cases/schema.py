"""The JSON Schema of configs/test_config.json, kept in code so the loader and the shipped file
are one thing: `python -c 'from harness.cases.schema import schema_text; print(schema_text(), end="")'
> configs/test_config.schema.json` writes the file (a test checks the two agree).

The schema checks shape and types; the rest of harness.cases adds what a schema cannot say
(duplicate ids, undefined @VAR@, world size, batch arithmetic) and turns every error into one
line naming the file, the case and the field.
"""

from __future__ import annotations

import json
from typing import Sequence

from harness.cases.config_types import BACKENDS, INFINITRAIN_LAUNCHES
from harness.contracts.flags import DECLARABLE_ROLES, FLAGS
from harness.contracts.models import MODEL_SPECS

SCHEMA_ID = "https://example.invalid/harness/test_config.schema.json"

# Trainer flags a case may set (the flag table's case-owned flags), with their JSON types.
# Strings are allowed for every flag because "@VAR@" substitution happens after validation; the
# loader checks the substituted value's type.
_STR = {"type": "string"}
_JSON_TYPE = {int: ["integer", "string"], float: ["number", "string"],
              bool: ["boolean", "string"], str: "string"}
ARG_TYPES: dict[str, dict] = {
    flag.name: {"type": _JSON_TYPE[flag.type]} for flag in FLAGS if flag.owner == "case"
}

_TOLERANCE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "atol": {"type": "number", "minimum": 0},
        "rtol": {"type": "number", "minimum": 0},
    },
}
_TOLERANCES_OVERRIDE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"loss": _TOLERANCE, "gradients": _TOLERANCE},
}
_COMPARE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"loss": {"type": "boolean"}, "gradients": {"type": "boolean"}},
}
_MODELS = {
    "type": "array",
    "items": {"enum": list(MODEL_SPECS)},  # the registered model families
    "minItems": 1,
    "uniqueItems": True,
}
# Case args: the flag table's flags, plus any other lower-case name: a foreign trainer's own
# flag, passed to it as written (the bundled trainer skips such a case, naming the flag).
_ARGS = {
    "type": "object",
    "properties": ARG_TYPES,
    "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$"},
    "additionalProperties": {"type": ["string", "number", "boolean"]},
}

# A trusted topology to use as the reference where one device cannot hold the model, e.g.
# {"tensor_parallel": 8}: topology flags only (the loader names any other).
_REFERENCE = {
    "type": "object",
    "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$"},
    "additionalProperties": {"type": ["integer", "boolean", "string"]},
}

# What a group and a case may override.
_OVERRIDES = {
    "description": {"type": "string"},
    "models": _MODELS,
    "tolerances": _TOLERANCES_OVERRIDE,
    "compare": _COMPARE,
    "reference": _REFERENCE,
}

SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "Precision-regression harness test config (InfiniTrain's test_config.json shape)",
    "type": "object",
    "additionalProperties": False,
    "required": ["test_groups"],
    "properties": {
        "$schema": {"type": "string"},
        "description": {"type": "string"},
        "variables": {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
        # InfiniTrain's build steps (master's `basic_compile_commands`, the newer branches'
        # `builds` of {id, profile, cmd}): recorded, never run by the harness, which tests the
        # build folder it is given.
        "basic_compile_commands": {"type": "array"},
        "builds": {"type": "array"},
        # Roles of trainer flags the harness's flag table does not know (harness.contracts.flags
        # DeclaredRoles): {"my_flag": "topology"}.
        "flag_roles": {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$"},
            "additionalProperties": {"enum": list(DECLARABLE_ROLES)},
        },
        "models": _MODELS,
        "model_files": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                model: {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["checkpoint", "input_bin"],
                    "properties": {"checkpoint": _STR, "input_bin": _STR},
                }
                for model in MODEL_SPECS
            },
        },
        "assets": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "preset": _STR,
                "seed": {"type": "integer", "minimum": 0},
                "dir": _STR,
            },
        },
        "trainer": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "backend": {"enum": list(BACKENDS)},
                "command": {"type": "array", "items": _STR, "minItems": 1},
                "build": _STR,
                "launch": {"enum": list(INFINITRAIN_LAUNCHES)},
                "version": _STR,
                "env": {"type": "object", "additionalProperties": _STR},
            },
        },
        "defaults": _ARGS,
        "tolerances": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "float32": _TOLERANCES_OVERRIDE,
                "bfloat16": _TOLERANCES_OVERRIDE,
            },
        },
        "compare": _COMPARE,
        "reference": _REFERENCE,
        "test_groups": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["tag", "tests"],
                "properties": {
                    # word characters: a pytest marker (`-m 8_proc` reads it), and the tags
                    # of InfiniTrain's nightly configs (`8_proc`) begin with a digit
                    "tag": {"type": "string", "pattern": "^[A-Za-z0-9_]+$"},
                    "defaults": _ARGS,
                    # InfiniTrain's newer runner: the group's launch through infini_run
                    # ({"nproc_per_node": 8}); the loader names a key its runner does not read
                    "infini_run_args": {
                        "type": "object",
                        "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                        "additionalProperties": {"type": ["integer", "string", "null"]},
                    },
                    **_OVERRIDES,
                    "tests": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["id"],
                            "properties": {
                                "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.+-]*$"},
                                "args": _ARGS,
                                **_OVERRIDES,
                            },
                        },
                    },
                },
            },
        },
    },
}


def with_backends(backends: Sequence[str]) -> dict:
    """SCHEMA with `trainer.backend` one of `backends`: the loader passes those registered at
    the time (harness.registry), so a backend registered after import is a valid one."""
    if list(backends) == list(BACKENDS):
        return SCHEMA
    properties = SCHEMA["properties"]
    trainer = properties["trainer"]
    return {**SCHEMA, "properties": {**properties, "trainer": {
        **trainer, "properties": {**trainer["properties"], "backend": {"enum": list(backends)}}}}}


def schema_text() -> str:
    return json.dumps(SCHEMA, indent=2) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
