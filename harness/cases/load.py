"""Load configs/test_config.json: read, parse (plain JSON: no NaN or Infinity), validate, build.

No torch, no pytest: `load_config(path)` returns a HarnessConfig whose `cases` are the expanded
(tag, case, model) triples in file order, so every pytest-xdist worker sees the same list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .build import build_config, infinitrain_shaped
from .config_types import HarnessConfig, Overrides
from .errors import ConfigError
from .schema import SCHEMA
from .validate import validate_schema


def read_tags(path: str | Path) -> list[str]:
    """The tags of a config, best effort (for marker registration before collection); a file
    that cannot be read gives [] here and its error at collection."""
    try:
        data = json.loads(Path(path).read_text())
        return [g["tag"] for g in data.get("test_groups", [])
                if isinstance(g, dict) and isinstance(g.get("tag"), str)
                and re.fullmatch(r"[A-Za-z0-9_]+", g["tag"])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def load_config(path: str | Path, overrides: Overrides | None = None) -> HarnessConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the test config: "
                          f"{error.strerror or error}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: invalid JSON at line {error.lineno} column {error.colno}: "
                          f"{error.msg}") from None
    except ValueError as error:
        raise ConfigError(f"{path}: invalid JSON: {error}") from None
    data, foreign = set_aside_foreign_keys(data)
    validate_schema(path, data)
    return build_config(path, data, overrides, foreign)


def set_aside_foreign_keys(data):
    """(the document without them, the top-level keys set aside): in a config of InfiniTrain's
    shape, a top-level key the harness does not use is InfiniTrain's own (a branch's new build
    list, a runner setting) and is named once in the session summary, never fatal; in the
    harness's own configs an unknown key stays an error (the schema names it)."""
    if not infinitrain_shaped(data):
        return data, ()
    known = SCHEMA["properties"]
    foreign = tuple(key for key in data if key not in known)
    return {k: v for k, v in data.items() if k not in foreign}, foreign


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")
