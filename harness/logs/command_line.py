"""The `[COMMAND]` line of an InfiniTrain log, read as the binary's gflags reads its argv.

InfiniTrain's runner writes `[COMMAND] ./gpt2 --input_bin ... --device cuda <case args>` at the
top of every case's log (scripts/run_models_and_profile.bash; ../shared/INFINITRAIN.md), or
`./infini_run --nproc_per_node=N [--] ./gpt2 ...` for a per-group launch. gflags' rules, as
gflags v2.2.2 src/gflags.cc reads them (the library InfiniTrain vendors):

- `--f=v` and `-f=v` set f to v; `--f v` sets a non-boolean f to the next word (:1077-1080);
- a boolean f without `=` is true (:814-815), so in `--sequence_parallel true` the word
  `true` is not its value but a positional argument the program ignores (and in
  `--sequence_parallel false` f is still true); `--nof` sets f false (:790-810);
- a bare `--` ends the flags (:1050-1053).

A flag's type comes from the flag table (harness.contracts.flags); a flag the table does not
know is kept as written, with `--f v` read as a value (what every such flag of InfiniTrain's
takes), and named in `Command.unknown`. No torch here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from harness.contracts.flags import FLAG_TABLE, FlagError

COMMAND_PREFIX = "[COMMAND]"
_QUOTED = re.compile(r"[\\'\"]")
# The launcher of a per-group launch (InfiniTrain's tools/infini_run) and its own flags.
LAUNCHER = "infini_run"
LAUNCHER_PROCESSES = "nproc_per_node"


class CommandError(ValueError):
    """A command line that cannot be read; the message names the file and what was expected."""


@dataclass(frozen=True)
class Command:
    """One run's program and flags, typed, as the binary read them."""

    program: str  # the binary's name (`gpt2`)
    args: dict[str, Any]  # every flag given, typed through the flag table where it knows it
    processes: int = 1  # infini_run's --nproc_per_node (1: the binary alone)
    unknown: tuple[str, ...] = ()  # flags the flag table does not know (kept as strings)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what a reader should know


def command_text(text: str) -> str | None:
    """The first `[COMMAND] ...` line's command (without the prefix), or None."""
    for line in text.splitlines():
        if line.startswith(COMMAND_PREFIX):
            return line[len(COMMAND_PREFIX):].strip()
    return None


def _split_flag(word: str) -> tuple[str, str | None] | None:
    """(name, value or None) of `--name[=value]` / `-name[=value]`; None for a non-flag."""
    if not word.startswith("-") or word == "-":
        return None
    body = word[2:] if word.startswith("--") else word[1:]
    name, sep, value = body.partition("=")
    return name, (value if sep else None)


def _read_flags(words: list[str], where: str) -> tuple[dict[str, Any], list[str], list[str],
                                                      list[str]]:
    """(flags, positional words, unknown names, notes) of a gflags argv."""
    flags: dict[str, Any] = {}
    positional, unknown, notes = [], [], []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            positional += words[i + 1:]
            break
        split = _split_flag(word)
        if split is None:
            positional.append(word)
            i += 1
            continue
        name, value = split
        flag = FLAG_TABLE.get(name)
        if flag is None and name.startswith("no") and FLAG_TABLE.get(name[2:]) is not None \
                and FLAG_TABLE[name[2:]].type is bool and value is None:
            flag, name, value = FLAG_TABLE[name[2:]], name[2:], "false"
        if flag is not None and flag.type is bool:
            if value is None:
                value = "true"
                following = words[i + 1] if i + 1 < len(words) else None
                if following in ("false", "0"):
                    notes.append(f"{where}: --{name} {following}: gflags reads a boolean flag "
                                 f"without `=` as true and {following!r} as a positional "
                                 f"argument, so --{name} is true")
        elif value is None:
            if i + 1 >= len(words):
                raise CommandError(f"{where}: --{name} is the last word; expected its value "
                                   "after it")
            i += 1
            value = words[i]
        if flag is None:
            unknown.append(name)
            flags[name] = value
        else:
            flags[name] = _recorded_value(flag, value, where)
        i += 1
    return flags, positional, unknown, notes


def _launcher(words: list[str], where: str) -> tuple[int, list[str]]:
    """(process count, the program's argv) of `infini_run [--nproc_per_node[=| ]N] [--]
    ./<program> ...`."""
    processes, i = 1, 0
    while i < len(words) and (words[i] == "--" or _split_flag(words[i]) is not None):
        name, value = _split_flag(words[i]) or ("--", None)
        if name != "--" and value is None and i + 1 < len(words) and words[i + 1].isdigit():
            i, value = i + 1, words[i + 1]
        if name == LAUNCHER_PROCESSES:
            if value is None or not value.isdigit() or int(value) < 1:
                raise CommandError(f"{where}: {LAUNCHER} --{LAUNCHER_PROCESSES}={value}; "
                                   "expected a positive integer")
            processes = int(value)
        i += 1
    if i >= len(words):
        raise CommandError(f"{where}: {LAUNCHER} with no program after its flags; expected "
                           f"`{LAUNCHER} --{LAUNCHER_PROCESSES}=N ./<program> ...`")
    return processes, words[i:]


def _recorded_value(flag, value: str, where: str) -> Any:
    """A recorded flag's value, typed as the flag table types it. Only its type is checked:
    the binary ran with it, so a value outside what the bundled trainer accepts (`--device
    maca` on a MetaX machine) is a fact of the run, not an error."""
    if flag.type is str:
        return value
    try:
        return flag.check(value)
    except FlagError:
        pass
    text = value.strip().lower()
    try:
        if flag.type is bool and text in ("true", "false", "1", "0", "t", "f", "y", "n",
                                          "yes", "no"):
            return text in ("true", "1", "t", "y", "yes")
        if flag.type is int:
            return int(text)
        if flag.type is float:
            return float(text)
    except ValueError:
        pass
    kind = {bool: "a boolean", int: "an integer"}.get(flag.type, "a number")
    raise CommandError(f"{where}: --{flag.name}={value!r}: expected {kind} (gflags' "
                       f"{flag.type.__name__} flag)")


def parse_command(command: str, where: str) -> Command:
    """The program and typed flags of a `[COMMAND]` line's command; `where` names the log in
    every message. CommandError for a line that is not a command of a program."""
    try:
        # the runner's lines hold no quotes: a plain split is shlex's answer, 30x faster
        words = command.split() if not _QUOTED.search(command) else shlex.split(command)
    except ValueError as error:
        raise CommandError(f"{where}: [COMMAND] {command!r}: {error}; expected a shell "
                           "command line") from None
    if not words:
        raise CommandError(f"{where}: an empty [COMMAND] line; expected `./<program> --flag "
                           "value ...`")
    processes, notes = 1, []
    if PurePosixPath(words[0]).name == LAUNCHER:
        processes, words = _launcher(words[1:], where)
    program = PurePosixPath(words[0]).name
    flags, positional, unknown, more = _read_flags(words[1:], where)
    notes += more
    return Command(program, flags, processes, tuple(unknown), tuple(notes))
