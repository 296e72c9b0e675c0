"""A module-level trace: what InfiniTrain master's `--precision_check` writes, read as data.

`--precision_check "level=1,save_tensors=true,path=DIR"` (InfiniTrain master b24d92f,
`infini_train/src/utils/precision_checker.cc`) hooks every module: its forward output and, in
the backward pass, the gradient with respect to that output (the full backward hook's
`GradOutputs`). One run writes ONE folder `DIR/<YYYYMMDD_HHMMSS>/` holding, per rank R,

    precision_check_rank_<R>.log                      one line per tensor, in execution order
    rank_<R>/<name>[_<idx>]_<forward|backward>.npy    the tensor, float32

`idx` counts how often (name, phase) was written before in the same iteration (none for the
first); the counters restart every iteration and the files are overwritten, so the last
iteration's tensors remain (precision_checker.cc:263-268, 305-320). The bundled trainer writes
the same format (harness.trainer.precision_check), so one reader serves both sides of a
comparison. Which module of one side is which of the other is a set of facts
(data/trace_pairing.json, read here); the comparison itself is harness.compare.trace.
No torch, no numpy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema

from .flags import FLAG_TABLE

PRECISION_CHECK_FLAG = "precision_check"
PHASES = ("forward", "backward")
# YYYYMMDD_HHMMSS: precision_check_config.cc names the run's folder by its start time
_STAMP = re.compile(r"^\d{8}_\d{6}$")
_LOG = re.compile(r"^precision_check_rank_(\d+)\.log$")
# precision_checker.cc:352-371: "<context> <name>[_idx]_<phase> tensor[<i>]: dtype=<t>
# shape=(<d>,...) min=... max=... mean=... [values] [NaN:<n> Inf:<m>]( <- ERROR)"; the
# context is "[GAS-g] [L-l]" and, where a layer name is set, that name (one word).
_LINE = re.compile(
    r"^\[GAS-(?P<gas>\d+)\] \[L-(?P<layer>\d+)\](?: \S+)? (?P<logged>\S+) "
    r"tensor\[(?P<tensor>\d+)\]: dtype=(?P<dtype>\w+) shape=\((?P<shape>[\d,]*)\)"
    r"(?:.*\[NaN:(?P<nan>\d+) Inf:(?P<inf>\d+)\])?")


class TraceError(ValueError):
    """A trace folder, log or file that is not what the precision checker writes: one line
    naming the file and what was expected."""


def precision_check_value(path: str | Path) -> str:
    """The flag's value for a module-level trace with every tensor saved into `path`."""
    return f"level=1,save_tensors=true,path={path}"


def trace_flags(flags: dict, step: int, folder: str | Path) -> dict:
    """The flags of a run cut at `step` with its trace written into `folder`: every output flag
    dropped (the run's own paths; `save` and its interval: a trace rerun must not write a
    checkpoint where a resumed case reads; evaluation and sampling, which compute nothing the
    step does) and the resume flag (`load`), a schedule over num_iteration pinned to the case's
    length (lr_decay_iters 0 means num_iteration: cutting the run must not change steps
    1..step)."""
    kept = {k: v for k, v in flags.items()
            if not (k in FLAG_TABLE and FLAG_TABLE[k].role in ("output", "resume"))}
    length = int(flags.get("num_iteration", FLAG_TABLE["num_iteration"].default))
    if "lr_decay_style" in kept and not int(kept.get("lr_decay_iters") or 0):
        kept["lr_decay_iters"] = length
    kept["num_iteration"] = int(step)
    kept[PRECISION_CHECK_FLAG] = precision_check_value(folder)
    return kept


@dataclass(frozen=True)
class TraceEntry:
    """One tensor of a trace: a module's forward output or its output's gradient."""
    module: str  # the module's qualified name as its trainer names it
    phase: str  # forward | backward
    index: int  # how many times (module, phase) was written before, this iteration
    tensor: int  # which output of the module (tensor[i])
    dtype: str
    shape: tuple[int, ...]
    nan: int
    inf: int
    order: int  # position in the rank's log: the execution order
    file: Path  # its .npy (which may be missing: read_trace checks)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"trace entry {self.module}: phase {self.phase!r}; expected one "
                             f"of {', '.join(PHASES)}")

    @property
    def label(self) -> str:
        """`h.3.attn forward`, `h.3.attn forward#1` for the second call."""
        return f"{self.module} {self.phase}" + (f"#{self.index}" if self.index else "")


@dataclass(frozen=True)
class Trace:
    root: Path  # the run's timestamp folder
    rank: int
    entries: tuple[TraceEntry, ...]


def find_trace_root(folder: str | Path) -> Path:
    """The one timestamp folder a run's `--precision_check path=` folder holds (or `folder`
    itself when it is one). TraceError: none, or more than one (two runs into one folder:
    which is this step's cannot be told)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder}: no precision-check folder (expected the run's "
                         f"--precision_check path)")
    if any(_LOG.match(p.name) for p in folder.iterdir()):
        return folder
    stamps = sorted(p for p in folder.iterdir() if p.is_dir() and _STAMP.match(p.name))
    if len(stamps) != 1:
        found = ", ".join(p.name for p in stamps) or "none"
        raise TraceError(f"{folder}: {len(stamps)} timestamp folders ({found}); expected "
                         f"exactly one YYYYMMDD_HHMMSS folder, written by one run")
    return stamps[0]


def trace_ranks(root: Path) -> list[int]:
    """The ranks whose log the timestamp folder holds. TraceError without rank 0's."""
    ranks = sorted(int(m.group(1)) for p in Path(root).iterdir() if (m := _LOG.match(p.name)))
    if 0 not in ranks:
        raise TraceError(f"{root}: no precision_check_rank_0.log (ranks found: "
                         f"{', '.join(map(str, ranks)) or 'none'}); expected one log per rank "
                         f"from rank 0")
    return ranks


def split_logged(logged: str, seen: dict[tuple[str, str], int]) -> tuple[str, str, int]:
    """`transformer.h.0_1_forward` -> (`transformer.h.0`, forward, 1). The index suffix is
    read only where the counter says one is due (the name was written before in this phase):
    a module whose own name ends in `_<digits>` stays whole."""
    for phase in PHASES:
        if logged.endswith("_" + phase):
            stem = logged[: -len(phase) - 1]
            break
    else:
        raise TraceError(f"{logged!r}: a logged name ends in _forward or _backward")
    match = re.match(r"^(.*)_(\d+)$", stem)
    if match and seen.get((match.group(1), phase), 0) == int(match.group(2)) > 0:
        return match.group(1), phase, int(match.group(2))
    return stem, phase, 0


def read_trace(root: str | Path, rank: int = 0) -> Trace:
    """One rank's entries of the last iteration in its log, in execution order. TraceError: no
    log or no `rank_<R>` folder for it, a line of another form, a call out of order, or a
    logged file missing."""
    root = Path(root)
    log = root / f"precision_check_rank_{rank}.log"
    tensors = root / f"rank_{rank}"
    if not log.is_file():
        raise TraceError(f"{log}: missing; expected rank {rank}'s precision-check log")
    if not tensors.is_dir():
        raise TraceError(f"{tensors}: missing; expected rank {rank}'s tensors (the run needs "
                         f"save_tensors=true)")
    entries: list[TraceEntry] = []
    seen: dict[tuple[str, str], int] = {}
    # The log is opened once per run and never truncated, while the counters restart every
    # iteration (precision_checker.cc:156-167; example/gpt2/main.cc:393): a name's call 0
    # seen again starts the next iteration, and only the last one's files remain.
    for number, text in enumerate(log.read_text(errors="replace").splitlines(), 1):
        if not text.strip():
            continue
        match = _LINE.match(text)
        if match is None:
            raise TraceError(f"{log}:{number}: {text[:80]!r}; expected '[GAS-g] [L-l] "
                             f"<name>_<forward|backward> tensor[i]: dtype=... shape=(...) ...'")
        module, phase, index = split_logged(match.group("logged"), seen)
        if index == 0 and seen.get((module, phase), 0) > 0:
            entries, seen = [], {}  # the next iteration
        if index != seen.get((module, phase), 0):
            raise TraceError(f"{log}:{number}: {match.group('logged')} is call {index} of "
                             f"{module} {phase}; expected call {seen.get((module, phase), 0)}")
        seen[(module, phase)] = index + 1
        file = tensors / f"{match.group('logged')}.npy"
        if not file.is_file():
            raise TraceError(f"{file}: missing; expected the tensor of {log.name} line {number}")
        shape = tuple(int(d) for d in match.group("shape").split(",") if d)
        entries.append(TraceEntry(module, phase, index, int(match.group("tensor")),
                                  match.group("dtype"), shape, int(match.group("nan") or 0),
                                  int(match.group("inf") or 0), len(entries), file))
    if not entries:
        raise TraceError(f"{log}: no entries; expected one line per traced tensor")
    return Trace(root, rank, tuple(entries))


# ------------------------------------------------------------------------- pairing facts

_FACT = {"type": "object", "additionalProperties": False,
         "required": ["subject", "bundled", "why", "source"],
         "properties": {"subject": {"type": ["string", "null"]},
                        "bundled": {"type": ["string", "null"]},
                        "why": {"type": "string", "minLength": 1},
                        "source": {"type": "string", "minLength": 1}}}
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["programs"],
    "properties": {
        "$comment": {"type": "string"},
        "programs": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "required": ["prefix", "stage_local_layers", "modules"],
            "properties": {
                "prefix": {"type": "object", "additionalProperties": False,
                           "required": ["value", "source"],
                           "properties": {"value": {"type": "string"},
                                          "source": {"type": "string", "minLength": 1}}},
                "stage_local_layers": {"type": "object", "additionalProperties": False,
                                       "required": ["value", "source"],
                                       "properties": {"value": {"type": "boolean"},
                                                      "source": {"type": "string",
                                                                 "minLength": 1}}},
                "modules": {"type": "array", "items": _FACT},
                # optional: modules (by the last parts of their bundled name) whose tensors the
                # subject writes as a (rows, last dim) view of the bundled trainer's shape
                "flattened": {"type": "object", "additionalProperties": False,
                              "required": ["value", "source"],
                              "properties": {"value": {"type": "array", "items": {
                                  "type": "string", "pattern": "^[a-z_0-9.]+$"}},
                                  "source": {"type": "string", "minLength": 1}}},
            }}}}}


@dataclass(frozen=True)
class ModuleFact:
    """One exception to "the same qualified name less the prefix": a module of one side only
    (the other is null) or one named differently."""
    subject: str | None
    bundled: str | None
    why: str
    source: str


@dataclass(frozen=True)
class Pairing:
    """How a foreign program's module names map onto the bundled trainer's."""
    program: str
    prefix: str
    prefix_source: str
    stage_local_layers: bool  # a PP stage numbers its layers from 0 (InfiniTrain)
    stage_local_source: str
    facts: tuple[ModuleFact, ...]
    # bundled module names' last parts (`attn.q_norm`) whose tensors the subject writes as a
    # (rows, last dim) view of the bundled shape, and the source line that shows it
    flattened: tuple[str, ...] = ()
    flattened_source: str = ""

    def is_flattened(self, bundled: str) -> bool:
        return any(bundled == s or bundled.endswith("." + s) for s in self.flattened)

    def as_bundled_shape(self, bundled: str, shape: tuple[int, ...],
                         target: tuple[int, ...]) -> bool:
        """Whether a subject tensor of `shape` is the bundled `target` seen flat: the module
        is one the facts name, the element counts and the last dimension agree."""
        if not self.is_flattened(bundled) or len(shape) != 2 or not target:
            return False
        count = 1
        for d in target:
            count *= d
        return shape[-1] == target[-1] and shape[0] * shape[1] == count

    def bundled_name(self, subject: str) -> str | None:
        """The bundled trainer's module for the subject's (a global layer index already in
        it); None for a module the bundled trainer does not have (a fact says why)."""
        for fact in self.facts:
            if fact.subject == subject:
                return fact.bundled
        if self.prefix and subject.startswith(self.prefix):
            return subject[len(self.prefix):]
        return subject

    def why_unpaired(self, name: str, side: str) -> str | None:
        """The fact that says a module of `side` (subject | bundled) has no counterpart."""
        for fact in self.facts:
            mine, other = (fact.subject, fact.bundled) if side == "subject" else \
                (fact.bundled, fact.subject)
            if mine == name and other is None:
                return f"{fact.why} ({fact.source})"
        return None


IDENTITY = Pairing("bundled", "", "the same trainer on both sides", False,
                   "the bundled trainer keeps the global layer index", ())


def _load() -> dict[str, Pairing]:
    text = resources.files("harness.contracts").joinpath("data/trace_pairing.json").read_text()
    data = json.loads(text)
    try:
        jsonschema.validate(data, SCHEMA)
    except jsonschema.ValidationError as error:
        where = "/".join(map(str, error.absolute_path)) or "(top)"
        raise ValueError(f"harness/contracts/data/trace_pairing.json: {where}: "
                         f"{error.message}") from None
    return {name: Pairing(name, entry["prefix"]["value"], entry["prefix"]["source"],
                          entry["stage_local_layers"]["value"],
                          entry["stage_local_layers"]["source"],
                          tuple(ModuleFact(**fact) for fact in entry["modules"]),
                          tuple(entry.get("flattened", {}).get("value", ())),
                          entry.get("flattened", {}).get("source", ""))
            for name, entry in data["programs"].items()}


PAIRINGS: dict[str, Pairing] = _load()


def pairing_of(program: str) -> Pairing:
    """The facts of a foreign program. KeyError names the programs that have them."""
    if program not in PAIRINGS:
        raise KeyError(f"no module pairing facts for program {program!r} (known: "
                       f"{', '.join(sorted(PAIRINGS))}; harness/contracts/data/"
                       f"trace_pairing.json)")
    return PAIRINGS[program]


_LAYER = re.compile(r"^(?P<head>(?:.*\.)?h\.)(?P<layer>\d+)(?P<tail>(?:\..*)?)$")


def globalize_layer(name: str, stage_layers: list[int] | tuple[int, ...]) -> str:
    """`transformer.h.<k>...` on a stage holding `stage_layers` (sorted global indices) ->
    `transformer.h.<stage_layers[k]>...`: InfiniTrain numbers a stage's layers from 0 in
    global order (transformer.cc:222-236). A name with no layer is returned as it is."""
    match = _LAYER.match(name)
    if match is None or not stage_layers:
        return name
    local = int(match.group("layer"))
    if local >= len(stage_layers):
        raise TraceError(f"{name}: local layer {local} on a stage of {len(stage_layers)} "
                         f"layers ({list(stage_layers)}); expected fewer")
    return f"{match.group('head')}{stage_layers[local]}{match.group('tail')}"


def pairing_table() -> list[str]:
    """The pairing facts as a markdown table (docs/traces.md holds it; a test keeps the
    two equal)."""
    lines = ["| program | InfiniTrain module | bundled trainer's | why | source |",
             "| --- | --- | --- | --- | --- |"]
    for pairing in PAIRINGS.values():
        lines.append(f"| {pairing.program} | `{pairing.prefix}<name>` | `<name>` | the prefix "
                     f"| {_cell(pairing.prefix_source)} |")
        if pairing.stage_local_layers:
            lines.append(f"| {pairing.program} | `{pairing.prefix}h.<k>` on a pipeline stage | "
                         f"`h.<the stage's k-th layer>` | a stage numbers its layers from 0 | "
                         f"{_cell(pairing.stage_local_source)} |")
        for suffix in pairing.flattened:
            lines.append(f"| {pairing.program} | `{pairing.prefix}h.<i>.{suffix}`, its tensors as "
                         f"(rows, last dim) | `h.<i>.{suffix}`, its own shape | the program "
                         f"views the tensor flat around the module: compared as that view | "
                         f"{_cell(pairing.flattened_source)} |")
        for fact in pairing.facts:
            lines.append(f"| {pairing.program} | {_code(fact.subject)} | {_code(fact.bundled)} "
                         f"| {_cell(fact.why)} | {_cell(fact.source)} |")
    return lines


def _code(name: str | None) -> str:
    return "none" if name is None else f"`{name}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
