"""One run folder judged on its own: every recorded case against the recorded run that is its
single-device reference, as a live session judges a case against the reference it runs.

A case's mathematics is read from its `[COMMAND]` line (harness.logs.command_line) over its
program's DEFINE_* defaults (harness.contracts.programs: `defaults`), through the reference rule
a live case's reference goes by (harness.contracts.flags.reference_args: the topology, memory,
output and resume flags dropped). Two runs compute the same step when their mathematics differ
at most in the program's `microbatch_flag`: gradient accumulation divides each microbatch's loss
by their count, so a step of 80 sequences is one microbatch of 80 or eight of 10, from the same
tokens in the same order.

The reference of a case, in one folder (one binary, one commit):

1. a *one-device run* of the same step: one device, none of the flags the reference drops set
   away from their defaults; one whose mathematics equals the case's exactly first;
2. else the least-parallel run of the same step stands in (fewest devices, then fewest such
   flags), and every line says so.

A case is judged with the verdict a live case gets against a recorded baseline
(harness.compare.baseline: the loss per step at the dtype's scale-free threshold, never below the
print resolution; the printed lr beside it). A log cut short of its planned steps fails, its
missing steps named. Where the first compared step agrees and a later one does not, the first
update differs rather than the forward, and the line says so.

Logs without a `[COMMAND]` line (older runs) are judged only by name: through a config's case
of that name (`--config`, InfiniTrain's scripts/test_config.json), else not at all, said so.
No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

from harness.compare.baseline import (
    BaselineVerdict,
    bfloat16_loss_resolution,
    LrVerdict,
    judge_baseline,
    judge_lr,
    step_limit,
    threshold_text,
)
from harness.contracts.flags import (
    DROPPED_BY_REFERENCE,
    FLAG_TABLE,
    NO_DECLARED_ROLES,
    DeclaredRoles,
    FlagError,
    reference_args,
    resumed_first_step,
    role_of,
)
from harness.contracts.programs import PROGRAMS

from .command_line import Command, CommandError, parse_command
from .readers import BadInput, RecordedRun, dtype_of
from .run_folder import RunPlace, run_place

# InfiniTrain prints a loss `{:.6f}` (master@b24d92f:example/gpt2/main.cc:493).
PRINTED_LOSS_RESOLUTION = 1e-6
PASSED, FAILED, REFERENCE, NO_REFERENCE, NOT_JUDGED, BAD = (
    "PASSED", "FAILED", "REFERENCE", "NO REFERENCE", "NOT JUDGED", "BAD INPUT")
STATUSES = (PASSED, FAILED, REFERENCE, NO_REFERENCE, NOT_JUDGED, BAD)
# The roles whose flags, set away from their defaults, make a run something other than a
# one-device run of its mathematics (output flags change nothing a run computes).
DEPARTING_ROLES = DROPPED_BY_REFERENCE - {"output"}


# The flags Topology's fields show by name; any other departing flag is shown as written.
TOPOLOGY_FIELDS = frozenset({"nthread_per_process", "tensor_parallel", "sequence_parallel",
                             "context_parallel", "pipeline_parallel",
                             "virtual_pipeline_parallel", "zero_stage",
                             "use_distributed_optimizer"})


@dataclass(frozen=True)
class Topology:
    """Where a recorded run ran: its device count and parallel degrees, as its flags say."""

    world: int
    dp: int = 1
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    zero: int = 0
    distributed_optimizer: bool = False
    others: tuple[str, ...] = ()  # other departing flags, as `--name=value`

    def text(self) -> str:
        """`DP 2 × TP 4 + SP`, `PP 4 × VPP 2`, `one device`."""
        parts = [f"DP {self.dp}"] if self.dp > 1 else []
        if self.tp > 1 or self.sp:
            parts.append(f"TP {self.tp}" + (" + SP" if self.sp else ""))
        if self.cp > 1:
            parts.append(f"CP {self.cp}")
        if self.pp > 1 or self.vpp > 1:
            parts.append(f"PP {self.pp}" + (f" × VPP {self.vpp}" if self.vpp > 1 else ""))
        text = " × ".join(parts) or "one device"
        extras = ([f"ZeRO {self.zero}"] if self.zero else []) + (
            ["distributed optimizer"] if self.distributed_optimizer else []) + list(self.others)
        return text + "".join(f" + {e}" for e in extras)


def _int(args: dict, name: str) -> int:
    value = args.get(name, FLAG_TABLE[name].default)
    return int(value if value is not None else 1)


def topology_of(args: dict[str, Any], processes: int, departures: Sequence[str],
                where: str) -> Topology:
    """The placement of a run with these flags (InfiniTrain's: world = processes x
    nthread_per_process, DP = world / (TP x CP x PP), harness.cases.args.world_size), or
    CommandError naming the log."""
    world = processes * _int(args, "nthread_per_process")
    tp, cp, pp = _int(args, "tensor_parallel"), _int(args, "context_parallel"), \
        _int(args, "pipeline_parallel")
    if world % (tp * cp * pp):
        raise CommandError(f"{where}: {world} devices is not a multiple of tensor_parallel * "
                           f"context_parallel * pipeline_parallel = {tp} * {cp} * {pp}; "
                           "expected InfiniTrain's rank layout (global.cc: world % (TP*CP*PP)"
                           " == 0)")
    return Topology(world, world // (tp * cp * pp), tp, bool(args.get("sequence_parallel")),
                    cp, pp, _int(args, "virtual_pipeline_parallel"), _int(args, "zero_stage"),
                    bool(args.get("use_distributed_optimizer")),
                    tuple(f"--{n}={args[n]}" for n in departures if n not in TOPOLOGY_FIELDS))


@cache
def program_defaults(program: str) -> dict[str, Any]:
    """The program's DEFINE_* defaults, typed through the flag table (one dict per program,
    read, never changed)."""
    out = {}
    for name, value in PROGRAMS[program].defaults.items():
        out[name] = FLAG_TABLE[name].check(value) if name in FLAG_TABLE else value
    return out


def recorded_mathematics(program: str, args: dict[str, Any],
                         declared: DeclaredRoles = NO_DECLARED_ROLES) -> dict[str, Any]:
    """What a recorded run's single-device reference computes: its flags over the program's
    defaults, through the reference rule a live case's reference goes by."""
    return reference_args({**program_defaults(program), **args}, declared)


def departures_of(program: str, args: dict[str, Any], declared: DeclaredRoles) -> tuple[str, ...]:
    """The flags of a run its reference drops (topology, memory, resume) set away from the
    program's (else the flag table's) default: what makes it other than a one-device run."""
    defaults = program_defaults(program)
    out = []
    for name, value in args.items():
        if role_of(name, declared) not in DEPARTING_ROLES:
            continue
        default = defaults.get(name, FLAG_TABLE[name].default if name in FLAG_TABLE else None)
        if value != default and not (value in ("", None) and default in ("", None)):
            out.append(name)
    return tuple(out)


@dataclass(frozen=True)
class RecordedCase:
    """One log of a run folder, with what its flags say it computed and where."""

    run: RecordedRun
    place: RunPlace
    program: str
    args: dict[str, Any] | None = None  # None: the flags are unknown
    flags_from: str = ""  # `[COMMAND]`, or the config case the flags were read from
    mathematics: dict[str, Any] | None = None
    topology: Topology | None = None
    departures: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()  # flags the flag table does not know (role assumed)
    notes: tuple[str, ...] = ()
    skip: str = ""  # why it cannot be judged (no facts, no flags)

    @property
    def label(self) -> str:
        name = f"{self.run.model}/{self.run.case}"
        return f"{self.run.tag}/{name}" if self.run.tag else name

    @property
    def dtype(self) -> str:
        if self.mathematics and isinstance(self.mathematics.get("dtype"), str):
            return self.mathematics["dtype"]
        return self.run.dtype

    @property
    def one_device(self) -> bool:
        return self.topology is not None and self.topology.world == 1 and not self.departures

    @property
    def step(self) -> tuple | None:
        """The step it computes: its mathematics less the microbatch split, hashable."""
        if self.mathematics is None:
            return None
        split = PROGRAMS[self.program].microbatch_flag
        return (self.program,) + tuple(sorted((k, repr(v)) for k, v in self.mathematics.items()
                                              if k != split))


def _unknown_note(names: Sequence[str], declared: DeclaredRoles, where: str) -> list[str]:
    return [f"{where}: --{n} is not in the flag table; judged with the role "
            f"{role_of(n, declared)!r} " + ("(declared)" if n in declared.roles else
                                            "assumed (kept in its reference; declare another "
                                            "with --flag-role NAME=ROLE)")
            for n in names]


def recorded_case(run: RecordedRun, declared: DeclaredRoles = NO_DECLARED_ROLES,
                  config_args: dict[str, tuple[dict, int, str]] | None = None
                  ) -> RecordedCase | BadInput:
    """A log's case: its flags from its `[COMMAND]` line (else from `config_args`, the config's
    cases by `tag/model/id` or `model/id`: (args, world, where)), its mathematics and
    placement; a BadInput for a line that cannot be read."""
    path = run.source
    place = run_place(Path(run.meta.get("file", path)), run.meta)
    base = RecordedCase(run, place, run.model)
    command_text = run.meta.get("command")
    processes = 1
    if command_text is not None:
        try:
            command: Command = parse_command(command_text, path)
        except CommandError as error:
            return BadInput(path, str(error), run.model, run.case, run.tag)
        program, args, processes = command.program, dict(command.args), command.processes
        flags_from, notes = "[COMMAND]", list(command.notes)
        if program != run.model:
            notes.append(f"{path}: the file is named for {run.model}, its [COMMAND] runs "
                         f"./{program}; judged as {program}")
    else:
        found = _config_case(run, config_args or {})
        if found is None:
            why = (f"{path}: no [COMMAND] line, so its flags are unknown; "
                   + ("no case of that name in the config" if config_args else
                      "give the config its runner ran (--config test_config.json) to read "
                      "them by case name") + "; judged only by name (python -m harness.logs "
                   "BASELINE SUBJECT)")
            return RecordedCase(run, place, run.model, skip=why)
        args, world, where = found
        program, flags_from = run.model, f"{where} (no [COMMAND] line: by name)"
        notes = [f"no [COMMAND] line: judged by its name, with the flags of {where}"]
        args = {**args, "nthread_per_process": world} if world > 1 and \
            "nthread_per_process" not in args else args
    if program not in PROGRAMS:
        return RecordedCase(run, place, program, args, flags_from,
                            skip=f"{path}: ./{program} is a program the harness has no facts for "
                                 f"(harness/contracts/data/infinitrain_programs.json knows "
                                 f"{', '.join(PROGRAMS)}); expected one of those")
    unknown = tuple(n for n in args if n not in FLAG_TABLE)
    notes += _unknown_note(unknown, declared, path)
    try:
        mathematics = recorded_mathematics(program, args, declared)
        departures = departures_of(program, args, declared)
        topology = topology_of(args, processes, departures, path)
    except (CommandError, FlagError) as error:
        return BadInput(path, str(error) if path in str(error) else f"{path}: {error}",
                        run.model, run.case, run.tag)
    return RecordedCase(run, place, program, args, flags_from, mathematics, topology,
                        departures, unknown, tuple(notes))


def _config_case(run: RecordedRun, config_args: dict) -> tuple[dict, int, str] | None:
    if run.tag and f"{run.tag}/{run.model}/{run.case}" in config_args:
        return config_args[f"{run.tag}/{run.model}/{run.case}"]
    return config_args.get(f"{run.model}/{run.case}")


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Judged:
    """One case of a run folder and its verdict against its reference."""

    case: RecordedCase | None
    status: str
    why: str = ""  # NOT JUDGED, NO REFERENCE, BAD INPUT: the one line
    reference: RecordedCase | None = None
    one_device: bool = False  # whether the reference is a one-device run
    verdict: BaselineVerdict | None = None
    lr: LrVerdict | None = None
    missing_steps: tuple[int, ...] = ()  # planned steps the case's log does not have
    uncompared_steps: tuple[int, ...] = ()  # the case's steps its reference's log lacks
    notes: tuple[str, ...] = ()
    bad: BadInput | None = None  # for BAD INPUT rows
    place: RunPlace | None = None
    references_of: tuple[str, ...] = field(default=(), compare=False)  # REFERENCE rows

    @property
    def label(self) -> str:
        if self.case is not None:
            return self.case.label
        b = self.bad
        name = f"{b.model}/{b.case}" if b and b.model else "?"
        return f"{b.tag}/{name}" if b and b.tag else name

    @property
    def dtype(self) -> str:
        if self.case is not None:
            return self.case.dtype
        return dtype_of(self.bad.case) if self.bad and self.bad.case else "?"

    @cached_property
    def worst_ratio(self) -> float | None:
        """The largest |diff| over the limit it was judged by (1.0: at the threshold)."""
        v = self.verdict
        if v is None or v.problem or not v.steps:
            return None
        return max(d / step_limit(v.dtype, b, v.resolution)
                   for d, b in zip(v.diffs, v.base_losses))

    @property
    def topology_difference(self) -> str | None:
        if self.case is None or self.reference is None or self.case.topology is None:
            return None
        against = "one device" if self.one_device else self.reference.topology.text()
        return f"{self.case.topology.text()} against {against}"

    def line(self) -> str:
        head = f"{self.status} {self.label} {self.dtype}"
        where = f" [{self.place.label}]" if self.place is not None else ""
        if self.status in (NOT_JUDGED, NO_REFERENCE, BAD) or (self.verdict is None
                                                             and self.status != REFERENCE):
            return f"{head}{where}: {self.why}"
        if self.status == REFERENCE:
            return (f"{head}{where}: " + ("the one-device run" if self.one_device else
                                          "the least-parallel run, standing in")
                    + f" the folder's {', '.join(self.references_of)} "
                    f"{'is' if len(self.references_of) == 1 else 'are'} judged against")
        v = self.verdict
        ref = self.reference
        against = (f"{self.topology_difference} ({ref.label})" if self.one_device else
                   f"{self.topology_difference} ({ref.label}; no one-device run of this "
                   f"mathematics in the folder; compared with {ref.label}, "
                   f"{ref.topology.text()})")
        if v.problem:
            return f"{head}{where}: {against}: bad pairing: {v.problem}"
        worst = (f"worst |diff| {v.max_abs_diff:.1e} at step {v.worst_step}, "
                 f"{self.worst_ratio:.2g}x the limit (threshold {v.threshold})")
        said = [f"{len(v.steps)} steps, {worst}" if v.ok else f"{v.lines()[0]}; {worst}"]
        if self.lr is not None:
            said.append(self.lr.lines()[0] if not self.lr.ok and self.lr.lines() else
                        f"lr {len(self.lr.steps)} steps within print resolution")
        if self.missing_steps:
            said.append(f"the log stops at step {max(self.case.run.steps)}: steps "
                        f"{_span(self.missing_steps)} missing")
        said += list(self.notes)
        return f"{head}{where}: {against}: " + "; ".join(said)


def _span(steps: Sequence[int]) -> str:
    s = sorted(steps)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 1:
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))


def first_update_note(v: BaselineVerdict) -> str | None:
    """Where the first compared step agrees and a later one diverges, the forward of the same
    weights agrees: the first update differs (a gradient not reduced where it should be, the
    optimizer) where the very next step diverges, a later update where one further on does."""
    if v.ok or v.problem or v.first_diverging_step is None or not v.steps:
        return None
    first, diverging = v.steps[0], v.first_diverging_step
    if diverging == first:
        return None
    if v.steps[1] == diverging:
        return (f"step {first} agrees (|diff| {v.diffs[0]:.1e}) and step {diverging} does "
                f"not: the forward of the same weights agrees, the update after step {first} "
                "differs (a gradient not reduced where it should be, or the optimizer)")
    last = v.steps[v.steps.index(diverging) - 1]
    return (f"steps {first}-{last} agree and step {diverging} does not: the step-{first} "
            f"forward agrees, an update before step {diverging} differs (or a difference grew "
            "over the limit)")


def loss_resolution(dtype: str, *sides: Sequence[float]) -> float:
    """What the logs can print: 1e-6 (`{:.6f}`), or one bfloat16 unit where a bfloat16 run's
    losses on both sides are bfloat16 values (harness.compare.baseline)."""
    quantized = bfloat16_loss_resolution(*sides) if dtype == "bfloat16" else None
    return max(PRINTED_LOSS_RESOLUTION, quantized or 0.0)


def judge_case(case: RecordedCase, ref: RecordedCase, one_device: bool) -> Judged:
    """The verdict of one recorded case against its reference."""
    where = f"{case.run.source} against {ref.run.source}"
    mine = dict(zip(case.run.steps, case.run.losses))
    theirs = dict(zip(ref.run.steps, ref.run.losses))
    first = resumed_first_step((case.args or {}).get("load"))
    planned = int((case.mathematics or {}).get("num_iteration")
                  or case.run.meta.get("planned_steps") or max(mine))
    missing = tuple(s for s in range(first, planned + 1) if s not in mine)
    common = sorted(set(mine) & set(theirs))
    uncompared = tuple(s for s in sorted(mine) if s not in theirs)
    notes = []
    if uncompared:
        notes.append(f"the reference's log lacks steps {_span(uncompared)}: not compared")
    if not common:
        verdict = judge_baseline((), (), (), (), case.dtype, where=where)
        return Judged(case, BAD, verdict.problem or "", ref, one_device, verdict,
                      place=case.place)
    run_losses, base_losses = [mine[s] for s in common], [theirs[s] for s in common]
    verdict = judge_baseline(common, run_losses, common, base_losses, case.dtype,
                             resolution=loss_resolution(case.dtype, run_losses, base_losses),
                             where=where)
    lr = _judge_lr(case.run, ref.run, common, where)
    note = first_update_note(verdict)
    if note:
        notes.append(note)
    notes += list(case.notes)
    if verdict.problem:
        status = BAD
    else:
        status = PASSED if verdict.ok and (lr is None or lr.ok) and not missing else FAILED
    return Judged(case, status, verdict.problem or "", ref, one_device, verdict, lr, missing,
                  uncompared, tuple(notes), place=case.place)


def _judge_lr(run: RecordedRun, ref: RecordedRun, steps: list[int], where: str):
    if not (run.lrs and ref.lrs):
        return None

    def column(r: RecordedRun):
        at = {s: (lr, res) for s, lr, res in zip(r.steps, r.lrs, r.lr_resolutions)}
        return [at[s][0] for s in steps], [at[s][1] for s in steps]

    (mine, my_res), (theirs, their_res) = column(run), column(ref)
    return judge_lr(steps, mine, my_res, steps, theirs, their_res, where=where)


def _reference_key(case: RecordedCase) -> tuple:
    """The order a stand-in is chosen in: fewest devices, fewest departing flags, the name."""
    return (case.topology.world, len(case.departures), case.label)


def judge_folder(cases: Iterable[RecordedCase | BadInput]) -> list[Judged]:
    """Every case of one run folder judged against its reference (module docstring)."""
    rows: list[Judged] = []
    readable: list[RecordedCase] = []
    for item in cases:
        if isinstance(item, BadInput):
            rows.append(Judged(None, BAD, item.message, bad=item))
        elif item.skip:
            rows.append(Judged(item, NOT_JUDGED, item.skip, place=item.place))
        else:
            readable.append(item)
    by_label: dict[str, list[RecordedCase]] = {}
    for case in readable:
        by_label.setdefault(case.label, []).append(case)
    for label, same in by_label.items():
        if len(same) > 1:
            sources = ", ".join(c.run.source for c in same)
            rows += [Judged(c, BAD, f"two logs of {label} in one run folder: {sources}; "
                                    "expected one", place=c.place) for c in same]
    readable = [c for c in readable if len(by_label[c.label]) == 1]
    groups: dict[tuple, list[RecordedCase]] = {}
    for case in readable:
        groups.setdefault(case.step, []).append(case)
    for members in groups.values():
        plain = sorted((c for c in members if c.one_device), key=_reference_key)
        primary = (plain or sorted(members, key=_reference_key))[0]
        used: list[str] = []
        for case in members:
            if case is primary:
                continue
            # another one-device run of the step is judged against the first; any other case
            # against a one-device run of exactly its mathematics where there is one
            exact = [r for r in plain if r.mathematics == case.mathematics and r is not case]
            ref = primary if case.one_device or not exact else exact[0]
            if ref is primary:
                used.append(case.label)
            rows.append(judge_case(case, ref, ref.one_device))
        if used:
            rows.append(Judged(primary, REFERENCE, reference=primary,
                               one_device=primary.one_device, place=primary.place,
                               references_of=tuple(used)))
        else:  # the only run of its step: whoever else there is had an exact reference
            rows.append(Judged(primary, NO_REFERENCE, _alone(primary, readable),
                               place=primary.place))
    return sorted(rows, key=_row_order)


def _alone(case: RecordedCase, folder: Sequence[RecordedCase]) -> str:
    """Why a case has no reference; where a flag the table does not know is what sets it
    apart, which run it would be judged against with that flag's role declared."""
    said = (f"the only run of its mathematics in the folder ({case.topology.text()}); "
            f"nothing to compare it with")
    if not case.unknown:
        return said

    def without_unknown(c: RecordedCase) -> tuple:
        return tuple(x for x in c.step if x[0] not in case.unknown)

    mine = without_unknown(case)
    others = sorted((c for c in folder if c is not case and c.step is not None
                     and without_unknown(c) == mine), key=_reference_key)
    flags = ", ".join(f"--{n}" for n in case.unknown)
    if others:
        said += (f"; {flags} (not in the flag table) is what sets it apart: were it topology "
                 f"(--flag-role {case.unknown[0]}=topology), {others[0].label} "
                 f"({others[0].topology.text()}) would be its reference")
    return said


def _row_order(row: Judged) -> tuple:
    return (row.place.label if row.place else "", row.label, row.status)


def worst_text(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2g}"


__all__ = ["PASSED", "FAILED", "REFERENCE", "NO_REFERENCE", "NOT_JUDGED", "BAD", "STATUSES",
           "Judged", "RecordedCase", "Topology", "judge_case", "judge_folder", "recorded_case",
           "recorded_mathematics", "threshold_text", "worst_text"]
