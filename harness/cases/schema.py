"""The JSON Schema of configs/test_config.json, kept in code so the loader and the shipped file
are one thing: `python -c 'from harness.cases.schema import schema_text; print(schema_text(), end="")'
> configs/test_config.schema.json` writes the file (a test checks the two agree).

The schema checks shape and types; the rest of harness.cases adds what a schema cannot say
(duplicate ids, undefined @VAR@, world size, batch arithmetic) and turns every error into one
line naming the file, the case and the field.
"""

from __future__ import annotations

import json

SCHEMA_ID = "https://example.invalid/harness/test_config.schema.json"

# Trainer flags a case may set (InfiniTrain's names), with their JSON types. Strings are allowed
# for every flag because "@VAR@" substitution happens after validation; the loader checks the
# substituted value's type.
_INT = {"type": ["integer", "string"]}
_NUM = {"type": ["number", "string"]}
_BOOL = {"type": ["boolean", "string"]}
_STR = {"type": "string"}
ARG_TYPES: dict[str, dict] = {
    "dtype": {"type": "string"},
    "batch_size": _INT,
    "sequence_length": _INT,
    "total_batch_size": _INT,
    "num_iteration": _INT,
    "learning_rate": _NUM,
    "weight_decay": _NUM,
    "optimizer": _STR,
    "seed": _INT,
    "tensor_parallel": _INT,
    "sequence_parallel": _BOOL,
    "pipeline_parallel": _INT,
    "virtual_pipeline_parallel": _INT,
    "pipeline_layer_partition": _STR,
    "pipeline_layer_costs": _STR,
    "pipeline_chunk_layout": _STR,
    "pipeline_model_parallel_layout": _STR,
    "pipeline_schedule": _STR,
    # Ours: data-parallel degree; world size = data_parallel * tensor_parallel * pipeline_parallel.
    "data_parallel": _INT,
    # InfiniTrain's: the number of devices (processes here); world size, dp = it / (tp * pp).
    "nthread_per_process": _INT,
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
    "items": {"enum": ["gpt2", "llama3"]},
    "minItems": 1,
    "uniqueItems": True,
}
# Case args: our trainer's flags, plus any other lower-case name (InfiniTrain flags our trainer
# lacks, e.g. zero_stage): the loader refuses unknown names, except InfiniTrain's own, whose
# cases are collected and skipped with the reason.
_ARGS = {
    "type": "object",
    "properties": ARG_TYPES,
    "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$"},
    "additionalProperties": {"type": ["string", "number", "boolean"]},
}

# What a group and a case may override.
_OVERRIDES = {
    "description": {"type": "string"},
    "models": _MODELS,
    "tolerances": _TOLERANCES_OVERRIDE,
    "compare": _COMPARE,
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
        # InfiniTrain's build step; accepted so its file loads, never run by the harness.
        "basic_compile_commands": {"type": "array"},
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
                for model in ("gpt2", "llama3")
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
                "backend": {"enum": ["harness", "command"]},
                "command": {"type": "array", "items": _STR, "minItems": 1},
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
        "test_groups": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["tag", "tests"],
                "properties": {
                    "tag": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                    "defaults": _ARGS,
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


def schema_text() -> str:
    return json.dumps(SCHEMA, indent=2) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
