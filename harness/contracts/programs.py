"""InfiniTrain's programs as facts: which binary, which config variables, which tags, how each
prints its loss and batches its steps. The facts are data (``data/infinitrain_programs.json``),
each with its source line on the InfiniTrain branch that shows it; this module reads them.

What a config of InfiniTrain's shape runs follows its own runner,
``scripts/run_models_and_profile.bash``:

- on ``feat/support_moe`` (b7e0760) a program runs the tags its ``<PREFIX>_TEST_GROUPS``
  variable names (a comma list, each name trimmed, ``*`` for every tag), or its default
  groups when the config leaves the variable out (lines 78-80, 95-100, 347-362);
- master and every other branch have no such variable: gpt2 and llama3 run every tag
  (master's lines 413-422), and no other program runs.

A config that names none of the ``*_TEST_GROUPS`` variables is read master's way. A
``<PREFIX>_TEST_GROUPS`` variable whose program has no entry here names a program the harness
has no facts for: its cases are listed and skipped with that reason, never run as another
program. No torch here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Callable

import jsonschema

STEP_LINES = ("glog", "stdout")  # through glog (stderr and glog's files), or std::cout
GROUPS_SUFFIX = "_TEST_GROUPS"
EVERY_TAG = "*"

_FACT = {"type": "object", "additionalProperties": False, "required": ["value", "source"],
         "properties": {"source": {"type": "string", "minLength": 1}}}


def _fact(value_schema: dict) -> dict:
    return {**_FACT, "properties": {**_FACT["properties"], "value": value_schema}}


_STRING = {"type": "string", "minLength": 1}
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["programs", "runner"],
    "properties": {
        "$comment": {"type": "string"},
        "programs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "binary", "variable_prefix", "groups_variable",
                         "default_groups", "runs_every_tag_without_groups", "step_line",
                         "batch_flags", "multi_device", "family", "defaults",
                         "microbatch_flag"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                "binary": _fact(_STRING),
                "variable_prefix": _fact({"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}),
                "groups_variable": _fact({"type": "string", "pattern": "^[A-Z][A-Z0-9_]*"
                                          + GROUPS_SUFFIX + "$"}),
                "default_groups": _fact({"type": "string"}),  # "": no tag (qwen3's)
                "runs_every_tag_without_groups": _fact({"type": "boolean"}),
                "step_line": _fact({"enum": list(STEP_LINES)}),
                "batch_flags": _fact({"type": "array", "items": _STRING, "minItems": 1}),
                "multi_device": _fact({"type": "boolean"}),
                "family": _fact({"type": ["string", "null"]}),
                "defaults": _fact({"type": "object", "additionalProperties": {
                    "type": ["string", "number", "boolean"]}}),
                "microbatch_flag": _fact(_STRING),
                "replaces": _fact(_STRING),  # optional: the program this one renamed
                # optional: shell variables its runner sets just before its command (NAME ->
                # the config variable it copies), seen by the command's eval
                "shell_variables": _fact({"type": "object", "additionalProperties": {
                    "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}}),
            }}},
        "runner": {
            "type": "object", "additionalProperties": False,
            "required": ["group_launch_keys", "exported_variables", "device_variable",
                         "device_default", "config_option"],
            "properties": {
                "group_launch_keys": _fact({"type": "array", "items": _STRING, "minItems": 1}),
                "exported_variables": _fact(_STRING),
                "device_variable": _fact({"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}),
                "device_default": _fact(_STRING),
                "config_option": _fact({"type": "string", "pattern": "^--[a-z-]+$"}),
            }},
    },
}
FACT_NAMES = tuple(name for name in SCHEMA["properties"]["programs"]["items"]["required"]
                   if name != "name")
OPTIONAL_FACTS = ("replaces", "shell_variables")


class ProgramFactsError(ValueError):
    """The facts file cannot be read; the message names it and what was expected."""


@dataclass(frozen=True)
class Program:
    name: str
    binary: str
    variable_prefix: str  # <PREFIX>_INPUT_BIN, <PREFIX>_LLMC_FILEPATH
    groups_variable: str  # <PREFIX>_TEST_GROUPS on feat/support_moe
    default_groups: str  # what that branch's runner uses when the config leaves it out
    runs_every_tag_without_groups: bool  # master's runner runs it on every tag
    step_line: str  # one of STEP_LINES
    batch_flags: tuple[str, ...]
    multi_device: bool
    family: str | None  # the bundled trainer's model family of the same mathematics
    # What a flag a command leaves out is: the binary's DEFINE_* default. A recorded run's
    # mathematics is these under its [COMMAND] line's flags (harness.logs.selfcheck); a live
    # session reads the binary's own listing instead (harness.launch.binary_facts).
    defaults: dict
    # The flag that only splits a step into microbatches (gradient accumulation, each
    # microbatch's loss divided by their count): two runs that differ in it alone compute the
    # same step from the same tokens.
    microbatch_flag: str
    sources: tuple[tuple[str, str], ...]  # (fact, BRANCH@COMMIT:path:line)
    # The program of the same variables that this one renamed (mixtral: tiny_mixtral): a build
    # folder holds one of the two binaries, and its runner runs that one (plan_tags).
    replaces: str | None = None
    # Shell variables the runner sets just before this program's command (LORA_WEIGHTS_DIR ->
    # GPT2_LORA_WEIGHTS_DIR): a `$NAME` in a case's args means the config variable named here.
    shell_variables: dict = field(default_factory=dict)

    @property
    def input_bin_variable(self) -> str:
        return f"{self.variable_prefix}_INPUT_BIN"

    @property
    def checkpoint_variable(self) -> str:
        return f"{self.variable_prefix}_LLMC_FILEPATH"

    def source(self, fact: str) -> str:
        return dict(self.sources)[fact]


def read_programs(text: str, where: str = "infinitrain_programs.json") -> dict[str, Program]:
    """The programs of a facts document, by name, or ProgramFactsError naming the entry."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ProgramFactsError(f"{where}: invalid JSON: {error}") from None
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    if error is not None:
        path = "/".join(map(str, error.absolute_path)) or "top level"
        raise ProgramFactsError(f"{where}: {path}: {error.message}")
    programs: dict[str, Program] = {}
    for entry in data["programs"]:
        name = entry["name"]
        if name in programs:
            raise ProgramFactsError(f"{where}: program {name!r} is listed twice; expected one "
                                    f"entry per program")
        facts = FACT_NAMES + tuple(f for f in OPTIONAL_FACTS if f in entry)
        values = {fact: entry[fact]["value"] for fact in facts}
        programs[name] = Program(
            name=name, **{**values, "batch_flags": tuple(values["batch_flags"])},
            sources=tuple((fact, entry[fact]["source"]) for fact in facts))
    for program in programs.values():
        if program.replaces is not None and program.replaces not in programs:
            raise ProgramFactsError(f"{where}: program {program.name!r} replaces "
                                    f"{program.replaces!r}, which has no entry; expected one of "
                                    f"{', '.join(programs)}")
    return programs


@dataclass(frozen=True)
class Runner:
    """What InfiniTrain's runner (scripts/run_models_and_profile.bash) reads beyond each
    program's facts: a group's `infini_run_args`, the variables its commands see, the device
    word it passes, its config option."""

    group_launch_keys: tuple[str, ...]  # the infini_run_args keys it reads (nproc_per_node)
    exported_variables: str  # which config variables a command's eval sees
    device_variable: str  # the variable whose value replaces `--device cuda` (DEVICE_BACKEND)
    device_default: str  # its value where the config leaves it out
    config_option: str  # how a config other than test_config.json is named (--test-config)
    sources: tuple[tuple[str, str], ...]

    def source(self, fact: str) -> str:
        return dict(self.sources)[fact]


RUNNER_FACTS = tuple(SCHEMA["properties"]["runner"]["required"])
# infini_run's process-count flag (tools/infini_run/infini_run.cc:12 DEFINE_int32(nproc_per_node,
# ...)): the one infini_run_args key whose meaning the harness has (a group's process count).
LAUNCHER_PROCESSES = "nproc_per_node"


def read_runner(text: str, where: str = "infinitrain_programs.json") -> Runner:
    """The runner facts of a facts document (read_programs checks the schema first)."""
    entry = json.loads(text)["runner"]
    values = {fact: entry[fact]["value"] for fact in RUNNER_FACTS}
    unknown = [key for key in values["group_launch_keys"] if key != LAUNCHER_PROCESSES]
    if unknown:
        raise ProgramFactsError(f"{where}: runner/group_launch_keys names {', '.join(unknown)}; "
                                f"the harness knows what {LAUNCHER_PROCESSES} means and no other "
                                f"infini_run_args key: expected {LAUNCHER_PROCESSES} only")
    return Runner(**{**values, "group_launch_keys": tuple(values["group_launch_keys"])},
                  sources=tuple((fact, entry[fact]["source"]) for fact in RUNNER_FACTS))


def _load() -> tuple[dict[str, Program], Runner]:
    text = resources.files("harness.contracts").joinpath(
        "data/infinitrain_programs.json").read_text()
    return read_programs(text), read_runner(text)


PROGRAMS, RUNNER = _load()


def program_for_groups_variable(variable: str) -> str:
    """The program name a `<PREFIX>_TEST_GROUPS` variable stands for: the facts' program of
    that variable, else the prefix in lower case (a program the harness has no facts for)."""
    for program in PROGRAMS.values():
        if program.groups_variable == variable:
            return program.name
    return variable[:-len(GROUPS_SUFFIX)].lower()


def groups_variable_of(program: str) -> str:
    """The `<PREFIX>_TEST_GROUPS` variable of a program (program_for_groups_variable's
    inverse): the facts' own, else the program's name in upper case."""
    return (PROGRAMS[program].groups_variable if program in PROGRAMS
            else f"{program.upper()}{GROUPS_SUFFIX}")


class GroupsError(ValueError):
    """A `*_TEST_GROUPS` value the runner would read other than it seems; str() is one line."""


def parse_groups(text: str, variable: str = "") -> tuple[str, ...]:
    """A `*_TEST_GROUPS` value as the runner reads it: exactly `*` is every tag (the newer
    runner's `[[ "$enabled_tags" == "*" ]]`, later@id69619520725:scripts/run_models_and_profile
    .bash:401); otherwise comma-separated, each name trimmed of white space, empty names dropped
    (feat/support_moe scripts/run_models_and_profile.bash:95-100, 347-362). A `*` among names
    matches no tag there (each name is compared as a literal string, :405-409), so such a value
    is refused (GroupsError naming `variable`) rather than read either way."""
    text = str(text)
    if text == EVERY_TAG:
        return (EVERY_TAG,)
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if EVERY_TAG in names:
        raise GroupsError(
            f"{variable}={text!r}: '*' among tag names matches no tag in "
            f"InfiniTrain's runner (it means every tag only as the whole value: "
            f"scripts/run_models_and_profile.bash:401); expected '*' alone or tag names")
    return names


_GROUPS_VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]*" + GROUPS_SUFFIX + "$")


@dataclass(frozen=True)
class TagPlan:
    """Which programs run which tags of a config, as its runner would decide, and what the
    harness has to say about it (one line each, for the session summary)."""

    programs_by_tag: dict[str, tuple[str, ...]]
    notes: tuple[str, ...]


def built_programs(has_binary: Callable[[str], bool] | None) -> tuple[Program, ...]:
    """The programs a build's runner would run: of a program and the one it replaces (mixtral,
    tiny_mixtral: the same variables), the one whose binary the build folder holds, the newer
    where it holds both, the older where it holds neither or no folder is known (the
    branches of the fetched repository build tiny_mixtral)."""
    def newer_is_built(newer: Program) -> bool:
        return has_binary is not None and has_binary(newer.binary)

    replaced_by = {p.replaces: p for p in PROGRAMS.values() if p.replaces is not None}
    return tuple(program for program in PROGRAMS.values()
                 if (newer_is_built(program) if program.replaces is not None
                     else program.name not in replaced_by
                     or not newer_is_built(replaced_by[program.name])))


def plan_tags(tags: tuple[str, ...], variables: dict, where: str,
              has_binary: Callable[[str], bool] | None = None) -> TagPlan:
    """Programs per tag for a config of InfiniTrain's shape with these tags and variables.
    `where` names the config file in the notes; `has_binary(name)` says whether the build
    folder holds a binary (None: no folder known), which decides between a program and the
    one it replaces (built_programs). GroupsError for a groups value the runner would misread."""
    named = {name: value for name, value in variables.items() if _GROUPS_VARIABLE.match(name)}
    notes: list[str] = []
    selection: dict[str, tuple[str, ...]] = {}  # program -> tags it runs ("*": every tag)
    programs = built_programs(has_binary)
    if not named:  # master's runner: gpt2 and llama3 on every tag
        for program in programs:
            if program.runs_every_tag_without_groups:
                selection[program.name] = (EVERY_TAG,)
    else:
        for program in programs:
            given = named.get(program.groups_variable)
            selection[program.name] = parse_groups(
                given if given is not None else program.default_groups,
                program.groups_variable)
        for variable in named:
            name = program_for_groups_variable(variable)
            if name not in PROGRAMS:
                selection[name] = parse_groups(named[variable], variable)
    for variable, value in named.items():  # a default naming a missing tag is no one's choice
        unknown = [t for t in parse_groups(value, variable)
                   if t != EVERY_TAG and t not in tags]
        if unknown:
            notes.append(f"{where}: variable {variable}={value!r} names tag(s) "
                         f"{', '.join(map(repr, unknown))} that the config does not have "
                         f"(its tags: {', '.join(tags)}); expected tags of its test_groups")
    by_tag = {tag: tuple(p for p, chosen in selection.items()
                         if EVERY_TAG in chosen or tag in chosen) for tag in tags}
    for tag, programs in by_tag.items():
        if not programs:
            notes.append(f"{where}: tag {tag!r}: no program runs it (" + ", ".join(
                f"{groups_variable_of(p)}={','.join(chosen)}" for p, chosen in selection.items())
                + "), as InfiniTrain's own runner would not: its cases are not collected")
    return TagPlan(by_tag, tuple(notes))


def program_table() -> list[str]:
    """The programs as a markdown table, one row per fact (docs/infinitrain_branches.md holds it; a test
    keeps the two equal)."""
    lines = ["| program | fact | value | source |", "| --- | --- | --- | --- |"]
    for program in PROGRAMS.values():
        for fact, source in program.sources:
            value = getattr(program, fact)
            shown = ", ".join(value) if isinstance(value, tuple) else ", ".join(
                f"{k} {json.dumps(v)}" for k, v in value.items()) if isinstance(value, dict) else (
                "none" if value is None else str(value).lower() if isinstance(value, bool)
                else value)
            lines.append(f"| {program.name} | {fact} | `{shown}` | {_cell(source)} |")
    for fact, source in RUNNER.sources:  # the runner's own facts, under its script's name
        value = getattr(RUNNER, fact)
        shown = ", ".join(value) if isinstance(value, tuple) else value
        lines.append(f"| (runner) | {fact} | `{shown}` | {_cell(source)} |")
    return lines


def _cell(text: str) -> str:
    """Text for a markdown table cell (a `|` in a quoted format string escaped)."""
    return text.replace("|", "\\|")
