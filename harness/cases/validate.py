"""JSON Schema validation of a parsed config, with jsonschema's best error turned into one line
naming the file, the case and the field, the value, and what was expected."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from harness.registry import backend_names

from .errors import failer_for
from .schema import SCHEMA, with_backends


def validate_schema(path: Path, data: Any) -> None:
    validator = jsonschema.Draft202012Validator(with_backends(backend_names()))
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
    failer_for(path, data)(location)(problem)


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
                failer_for(path, data)(location)(
                    f"{value!r} does not match the pattern {pattern!r}")
