"""ConfigError, and where in the config an error is: every message is one line naming the file,
then the tag, the case and the field (`tag 'basic', case 'pp2', field args.batch_size`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NoReturn


class ConfigError(ValueError):
    """A bad test config; str() is one line naming the file, the case and the field."""


def failer_for(path: Path, data: Any) -> Callable[[list], Callable[[str], NoReturn]]:
    """`failer_for(path, data)(location)(problem)` raises the ConfigError for a JSON path."""
    def at(location: list):
        def fail(problem: str):
            raise ConfigError(f"{path}: {where(data, location)}: {problem}")
        return fail
    return at


def where(data: Any, location: list) -> str:
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
