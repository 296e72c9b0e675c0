"""A case's trainer flags, from the config's text to the values a run is launched with:
@VAR@ substitution (text only, nothing is evaluated), in a config of InfiniTrain's shape `$NAME`
as its runner's shell would expand it (ShellScope), each flag's typed value from the flag
table (`harness.contracts.flags`; a flag the table does not know is a foreign trainer's own, kept as
written), defaults < group defaults < case args with the flags the harness owns refused, and
the world size (dp, or InfiniTrain's `nthread_per_process`, x tp x pp) and total-batch
arithmetic."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from difflib import get_close_matches
from typing import Any

from harness.contracts.flags import FLAG_TABLE, FLAGS, HARNESS, FlagError, expected, microbatches

# ---------------------------------------------------------------------- the flag table's view

# Flags the harness sets itself for every run, and what a config does instead.
HARNESS_OWNED = {
    "model": "list the model in `models`",
    "llmc_filepath": "set `model_files.<model>.checkpoint`",
    "input_bin": "set `model_files.<model>.input_bin`",
    "device": "use --harness-device",
    "output_dir": "the harness gives every run its own folder",
    "dump_gradients": "the harness dumps gradients when `compare.gradients` is true",
    "dump_parameter_updates": "the harness dumps them when `compare.gradients` is true",
    "profile_layers": "not a precision-test setting",
    "precision_check": "the harness traces a failed case's modules (--harness-trace)",
}
assert set(HARNESS_OWNED) == {f.name for f in FLAGS if f.owner == "harness"}, \
    "HARNESS_OWNED must name exactly the flag table's harness-owned flags"
# The bundled trainer's defaults of the hyper-parameters every case resolves.
TRAINER_DEFAULTS = {
    name: FLAG_TABLE[name].default
    for name in ("dtype", "batch_size", "sequence_length", "num_iteration", "learning_rate",
                 "weight_decay", "optimizer", "seed", "tensor_parallel", "sequence_parallel",
                 "pipeline_parallel", "virtual_pipeline_parallel")
}


def coerce(name: str, value: Any, fail) -> Any:
    """The typed value of one flag (after substitution); a foreign flag's value as written."""
    flag = FLAG_TABLE.get(name)
    if flag is None:
        return value
    try:
        return flag.check(value)
    except FlagError:
        pass
    try:  # the right type, out of bounds?
        replace(flag, minimum=None, value_range=None, choices=()).check(value)
    except FlagError:
        fail(f"{value!r} is not {_KIND[flag.type]}")
    fail(f"{value!r} is not {expected(flag)}")


_KIND = {int: "an integer", float: "a number", bool: "a boolean; expected true or false",
         str: "a string"}


# ---------------------------------------------------------------------- @VAR@ substitution

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


# ---------------------------------------------------------------------- $NAME, as the runner's shell

# What InfiniTrain's runner expands when it evals a command: $NAME or ${NAME}; any other use of
# `$` ($(...), ${NAME:-x}, $1) is shell the harness does not evaluate, and is refused.
_SHELL_NAME = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class ShellScope:
    """The variables one program's command sees when InfiniTrain's runner evals it: the
    config's variables (exported verbatim) and what the runner sets just before that program
    (harness.contracts.programs: Program.shell_variables). `unset` says, for a name the scope
    lacks, why (the line an error names)."""

    program: str
    values: dict[str, str]
    unset: dict[str, str] = field(default_factory=dict)

    def why_unset(self, name: str) -> str:
        return self.unset.get(name, f"${name} is neither a variable of the config nor one "
                                    f"InfiniTrain's runner sets for {self.program}; expected it "
                                    f"in `variables` (or --harness-var {name}=VALUE)")


def shell_text(value: Any) -> str:
    """A config variable's value as the runner's jq writes it before exporting it
    (`"\\(.key)=\\(.value)"`: strings verbatim, booleans true / false, numbers as JSON)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def shell_expand(value: Any, scope: "ShellScope | None", fail) -> Any:
    """`value` with each $NAME / ${NAME} replaced from `scope` (None: nothing is expanded, the
    harness's own configs); a name the scope lacks, or other shell syntax, fails in one line."""
    if scope is None or not isinstance(value, str) or "$" not in value:
        return value
    out, at = [], 0
    while (dollar := value.find("$", at)) >= 0:
        match = _SHELL_NAME.match(value, dollar)
        if match is None:
            fail(f"{value!r}: shell syntax at {value[dollar:dollar + 12]!r} that the harness does "
                 f"not evaluate; expected $NAME or ${{NAME}} (InfiniTrain's runner evals the "
                 f"command, the harness expands variables only)")
        name = match["braced"] or match["plain"]
        if name not in scope.values:
            fail(f"{value!r}: {scope.why_unset(name)}")
        out += [value[at:dollar], scope.values[name]]
        at = match.end()
    return "".join(out + [value[at:]])


# ---------------------------------------------------------------------- world size, batch

def world_size(flags: dict[str, Any], data_parallel: tuple | None, nthreads: tuple | None,
               failer, context_parallel: int = 1, processes: tuple | None = None) -> int:
    """dp x tp x cp x pp, or InfiniTrain's rank count checked against tp x cp x pp (and
    against dp when both are given), as InfiniTrain's rank layout divides it
    (feat/context_parallel@d03ba16:infini_train/src/nn/parallel/global.cc:126-128: world %
    (TP * CP * PP) == 0, DP = world / TP / CP / PP). InfiniTrain's ranks are its processes
    times each one's threads (PROC_WORLD_SIZE x nthread_per_process): `processes` is a group's
    infini_run process count. `data_parallel`, `nthreads` and `processes` are (value, location)
    or None."""
    # (name, degree) of each model-parallel dimension; CP named only where a case sets it
    degrees = [("tensor_parallel", flags["tensor_parallel"])] + (
        [("context_parallel", context_parallel)] if context_parallel != 1 else []) + [
        ("pipeline_parallel", flags["pipeline_parallel"])]
    model_parallel = math.prod(degree for _, degree in degrees)
    names = " * ".join(name for name, _ in degrees)
    if nthreads is not None or processes is not None:
        threads = nthreads[0] if nthreads is not None else 1
        world = threads * (processes[0] if processes is not None else 1)
        # (nthread_per_process counts InfiniTrain's processes in its scripts' words)
        counted = f"{world} processes" if processes is None or nthreads is None else (
            f"{processes[0]} processes x {threads} threads = {world} ranks")
        if world % model_parallel:
            failer(nthreads[1] if processes is None else processes[1])(
                f"{counted} is not a multiple of {names} = "
                f"{' * '.join(str(degree) for _, degree in degrees)} = {model_parallel}")
        if data_parallel is not None and data_parallel[0] * model_parallel != world:
            failer(data_parallel[1])(
                f"data_parallel {data_parallel[0]} * {names} "
                f"{model_parallel} != " + (f"nthread_per_process {world}" if processes is None
                                           else counted))
    else:
        world = (data_parallel[0] if data_parallel else 1) * model_parallel
    return world


def resolve_total_batch_size(flags: dict[str, Any], world: int, location: list, failer,
                             context_parallel: int = 1) -> None:
    """Default `total_batch_size` to one pass of every data-parallel rank, or refuse (at
    `location`) one that the passes do not divide."""
    dp = world // (flags["tensor_parallel"] * flags["pipeline_parallel"] * context_parallel)
    batch, sequence = flags["batch_size"], flags["sequence_length"]
    if "total_batch_size" not in flags:
        flags["total_batch_size"] = batch * sequence * dp  # one microbatch per rank
        return
    try:  # the arithmetic is the spec's, as the trainer checks it (trainer.flags)
        microbatches(flags["total_batch_size"], batch, sequence, dp)
    except FlagError:
        pass
    else:
        return
    # The config's wording: the field is named by `location`, not as a --flag.
    failer(location)(
        f"{flags['total_batch_size']} is not a multiple of batch_size * sequence_length * "
        f"data-parallel size = {batch} * {sequence} * {dp} = {batch * sequence * dp}")


# ---------------------------------------------------------------------- merging the layers

# How close an unknown flag's name must be to a known one to be refused as a typo (difflib's
# ratio: batch_sise / batch_size is 0.9; a foreign trainer's own names are far from ours).
TYPO_CUTOFF = 0.85
# Flags the harness turns into a process count instead of passing them to its own trainer.
_WORLD_FLAGS = ("data_parallel", "nthread_per_process")


def resolve_args(layers, variables, failer, shell: ShellScope | None = None,
                 processes: tuple | None = None):
    """Merge defaults < group defaults < case args; substitute (@VAR@, then `$NAME` from
    `shell` where given) and type. `processes`: (a group's infini_run process count, its
    location), or None.
    Returns (flags, args, world size): `args` are the flags exactly as the config says (after
    substitution and typing; foreign flags as written), what a foreign trainer is launched with;
    `flags` are the bundled trainer's resolved flags (its defaults filled in)."""
    merged: dict[str, tuple[Any, list]] = {}
    for location, args in layers:
        for name, value in args.items():
            merged[name] = (value, location + [name])
    flags: dict[str, Any] = dict(TRAINER_DEFAULTS)
    given: dict[str, Any] = {}
    counts: dict[str, tuple] = {}
    for name, (raw, location) in merged.items():
        fail = failer(location)
        if name in HARNESS_OWNED:
            fail(f"is set by the harness, not by a case: {HARNESS_OWNED[name]}")
        if name not in FLAG_TABLE:
            typo = get_close_matches(name, FLAG_TABLE, n=1, cutoff=TYPO_CUTOFF)
            if typo:
                fail(f"unknown trainer flag {name!r}; did you mean {typo[0]!r}? (a flag the "
                     f"harness does not know is passed to a foreign trainer as written, but "
                     f"this one is a near-miss of a known flag)")
        value = coerce(name, shell_expand(substitute(raw, variables, fail), shell, fail), fail)
        if name in _WORLD_FLAGS:
            counts[name] = (value, location)
        if name != "data_parallel":  # ours alone: no trainer has it
            given[name] = value
        if name not in _WORLD_FLAGS and name in FLAG_TABLE and HARNESS in FLAG_TABLE[name].trainers:
            flags[name] = value
    context = int(given.get("context_parallel", 1))
    world = world_size(flags, counts.get("data_parallel"), counts.get("nthread_per_process"),
                       failer, context, processes)
    last_location = next(iter(merged.values()))[1][:-1] if merged else layers[-1][0]
    location = merged.get("total_batch_size", (None, last_location + ["total_batch_size"]))[1]
    resolve_total_batch_size(flags, world, location, failer, context)
    return flags, given, world
