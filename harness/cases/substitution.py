"""@VAR@ substitution in config strings: text only, nothing is evaluated."""

from __future__ import annotations

import re
from typing import Any

_VAR = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")


def substitute(value: Any, variables: dict, fail) -> Any:
    """@VAR@ string substitution (no evaluation). A string that is exactly "@VAR@" takes the
    variable's value with its JSON type, so "@BATCH@" can stand for a number."""
    if not isinstance(value, str):
        return value
    whole = _VAR.fullmatch(value)
    if whole:
        name = whole.group(1)
        _check_defined(name, value, variables, fail)
        return variables[name]

    def replace(match: re.Match) -> str:
        name = match.group(1)
        _check_defined(name, value, variables, fail)
        item = variables[name]
        return ("true" if item else "false") if isinstance(item, bool) else str(item)

    return _VAR.sub(replace, value)


def _check_defined(name: str, value: str, variables: dict, fail) -> None:
    if name not in variables:
        fail(f"undefined variable @{name}@ in {value!r}; defined: "
             f"{', '.join(sorted(variables)) or 'none'}")
