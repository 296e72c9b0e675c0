"""Case expansion: every (tag, case, model) of the test groups, in file order, with its
resolved flags, world size, tolerances and comparisons (top level < group < case)."""

from __future__ import annotations

from harness.contracts.flags import DTYPES, FLAG_TABLE, NO_DECLARED_ROLES, DeclaredRoles
from harness.contracts.programs import LAUNCHER_PROCESSES, PROGRAMS, RUNNER, groups_variable_of
from harness.contracts.tolerance import Tolerance, Tolerances

from .args import ShellScope, coerce, resolve_args, shell_text, substitute, world_size
from .config_types import Case, Compare

# The element-wise defaults per dtype (docs/verdicts.md "Numerics").
# Loss: InfiniTrain's scripts/compare_loss.py thresholds, absolute: fp32 1e-5, bf16 1e-2.
DEFAULT_ATOL = {"float32": 1e-5, "bfloat16": 1e-2}
# Gradients: fp32 atol 1e-5 (InfiniTrain's #209 e2e scripts: precision_compare.py --atol 1e-5
# --rtol 0). bf16 is not the loss's 1e-2, which let every gradient of order 1e-3 through: from
# the bundled trainer's measured bf16 noise, the smallest atol every element passes at rtol 2e-2
# was 5.9e-5 (tiny preset, TP2, 8 cases) and 9.2e-4 (GPT-2 124M shape, TP2; max |d| 1.68e-3):
# atol 3e-3 with rtol 2e-2 keeps 3.1x / 16x over that noise (min over elements of
# (atol + rtol |ref|) / |d|) and still catches a dropped microbatch (12.5 %) on elements above 0.03.
DEFAULT_GRADIENT_TOLERANCE = {"float32": Tolerance(1e-5, 0.0), "bfloat16": Tolerance(3e-3, 2e-2)}


def expand_cases(data: dict, variables: dict, models: tuple[str, ...], failer,
                 declared: DeclaredRoles = NO_DECLARED_ROLES,
                 programs_by_tag: dict[str, tuple[str, ...]] | None = None,
                 shell: bool = False,
                 ) -> tuple[tuple[str, ...], tuple[Case, ...]]:
    """The config's tags (first-seen order) and its expanded cases. `programs_by_tag`: for
    InfiniTrain's own config, the programs its runner runs per tag (harness.contracts.programs;
    a case's or group's `models` still wins); None: `models` for every tag. `shell`: a config
    of InfiniTrain's shape, whose `$NAME` values its runner's shell expands (per program:
    shell_scope)."""
    default_tolerances = {}
    for dtype in DTYPES:
        base = Tolerances(Tolerance(DEFAULT_ATOL[dtype]), DEFAULT_GRADIENT_TOLERANCE[dtype])
        default_tolerances[dtype] = _tolerances(base, data.get("tolerances", {}).get(dtype))
    top_compare = _compare(Compare(), data.get("compare"), failer(["compare"]))
    top_defaults = data.get("defaults", {})
    top_reference = _reference({}, data.get("reference"), variables, failer(["reference"]))

    tags: list[str] = []
    cases: list[Case] = []
    seen: dict[tuple[str, str], str] = {}
    for g, group in enumerate(data["test_groups"]):
        tag = group["tag"]
        if tag not in tags:
            tags.append(tag)
        group_compare = _compare(top_compare, group.get("compare"),
                                 failer(["test_groups", g, "compare"]))
        processes = group_launch(group.get("infini_run_args"), variables,
                                 ["test_groups", g, "infini_run_args"], failer)
        for t, test in enumerate(group["tests"]):
            where = ["test_groups", g, "tests", t]
            source = f"test_groups[{g}].tests[{t}]"
            key = (tag, test["id"])
            if key in seen:
                failer(where + ["id"])(f"duplicate case id {test['id']!r} in tag {tag!r} "
                                       f"(also {seen[key]}); ids must be unique within a tag")
            seen[key] = source
            layers = [(["defaults"], top_defaults),
                      (["test_groups", g, "defaults"], group.get("defaults", {})),
                      (where + ["args"], test.get("args", {}))]
            reference = _reference(
                _reference(top_reference, group.get("reference"), variables,
                           failer(["test_groups", g, "reference"])),
                test.get("reference"), variables, failer(where + ["reference"]))
            compare = _compare(group_compare, test.get("compare"), failer(where + ["compare"]))
            chosen = models if programs_by_tag is None else programs_by_tag[tag]
            # each program's own resolution: its runner's shell gives each its own variables;
            # a test no program runs is still checked (without `$NAME` expansion)
            for model in test.get("models", group.get("models", chosen)) or (None,):
                flags, args, world_size = resolve_args(
                    layers, variables, failer,
                    shell_scope(model, variables) if shell and model else None, processes)
                if model is None:
                    continue
                dtype = flags["dtype"]
                tolerances = _tolerances(
                    _tolerances(default_tolerances[dtype], group.get("tolerances")),
                    test.get("tolerances"))
                cases.append(Case(
                    tag=tag, case_id=test["id"], model=model, flags=dict(flags),
                    world_size=world_size, tolerances=tolerances, compare=compare,
                    source=source, description=test.get("description", ""),
                    args=dict(args), reference_topology=reference,
                    reference_world_size=_reference_world(reference, failer(where + ["reference"])),
                    declared=declared, skip=_no_facts(model, programs_by_tag),
                    launcher_processes=processes[0] if processes else 0,
                ))
    return tuple(tags), tuple(cases)


def group_launch(spec: dict | None, variables: dict, location: list, failer) -> tuple | None:
    """(process count, location) of a group's `infini_run_args`, read as InfiniTrain's runner
    reads it (harness.contracts.programs RUNNER: its one key, `// empty`: absent, null, false
    or "" is no launch of its own), or None. A key the runner does not read fails in one line."""
    if not spec:
        return None
    for key in spec:
        if key not in RUNNER.group_launch_keys:
            failer(location + [key])(
                f"InfiniTrain's runner reads no infini_run_args key {key!r}; expected "
                f"{' or '.join(RUNNER.group_launch_keys)} "
                f"({RUNNER.source('group_launch_keys').split(' (')[0]})")
    fail = failer(location + [LAUNCHER_PROCESSES])
    raw = substitute(spec.get(LAUNCHER_PROCESSES), variables, fail)
    if raw is None or raw is False or raw == "":
        return None
    if isinstance(raw, bool) or not (isinstance(raw, int) or str(raw).isdigit()) \
            or int(raw) < 1:
        fail(f"{raw!r} is not a process count; expected a positive integer (infini_run "
             f"--{LAUNCHER_PROCESSES}=N)")
    return int(raw), location + [LAUNCHER_PROCESSES]


def shell_scope(program: str, variables: dict) -> ShellScope:
    """What `program`'s command sees when InfiniTrain's runner evals it: every config variable
    as exported (RUNNER exported_variables), and the variables the runner sets just before that
    program (Program.shell_variables: LORA_WEIGHTS_DIR from GPT2_LORA_WEIGHTS_DIR for gpt2).
    A variable the runner sets for other programs only holds, for this one, whatever the
    program run before it left: unset here, with that reason, never guessed."""
    values = {name: shell_text(value) for name, value in variables.items()}
    unset: dict[str, str] = {}
    setters: dict[str, list] = {}
    for other in PROGRAMS.values():
        for name in other.shell_variables:
            setters.setdefault(name, []).append(other)
    own = PROGRAMS[program].shell_variables if program in PROGRAMS else {}
    for name, programs in setters.items():
        if name in own:
            copied = own[name]
            if copied in variables:
                values[name] = values[copied]
                continue
            why = (f"InfiniTrain's runner sets ${name} for {program} from the variable {copied} "
                   f"({PROGRAMS[program].source('shell_variables').split(' (')[0]}), which the "
                   f"config does not define; expected {copied} in `variables` (or --harness-var "
                   f"{copied}=VALUE)")
        else:
            why = (f"InfiniTrain's runner sets ${name} for {', '.join(p.name for p in programs)} "
                   f"only (from {', '.join(p.shell_variables[name] for p in programs)}); for "
                   f"{program} it holds whatever the program run before it left, which the "
                   f"harness does not guess")
        values.pop(name, None)
        unset[name] = why
    return ShellScope(program, values, unset)


def _no_facts(program: str, programs_by_tag) -> str:
    """Why a program of InfiniTrain's own config cannot run: the harness has no facts for it
    (harness/contracts/data/infinitrain_programs.json); "" when it has."""
    if programs_by_tag is None or program in PROGRAMS:
        return ""
    return (f"InfiniTrain program {program!r} (variable {groups_variable_of(program)}): the "
            f"harness has no facts for it (its binary, model files, loss line; known: "
            f"{', '.join(PROGRAMS)} in harness/contracts/data/infinitrain_programs.json), so it "
            f"is not run, and never as another program")


def _tolerance(base: Tolerance, override: dict | None) -> Tolerance:
    if not override:
        return base
    return Tolerance(override.get("atol", base.atol), override.get("rtol", base.rtol))


def _tolerances(base: Tolerances, override: dict | None) -> Tolerances:
    if not override:
        return base
    return Tolerances(_tolerance(base.loss, override.get("loss")),
                      _tolerance(base.gradients, override.get("gradients")))


def _compare(base: Compare, override: dict | None, fail) -> Compare:
    if not override:
        return base
    try:
        return Compare(override.get("loss", base.loss), override.get("gradients", base.gradients))
    except ValueError as error:
        fail(str(error))


def _reference(base: dict, override: dict | None, variables: dict, fail) -> dict:
    """The reference's topology: topology flags only (the reference keeps the case's
    mathematics), typed; {} is one device."""
    if override is None:
        return base
    topology = {}
    for name, raw in override.items():
        flag = FLAG_TABLE.get(name)
        if flag is None or flag.role != "topology":
            known = ", ".join(f.name for f in FLAG_TABLE.values() if f.role == "topology")
            fail(f"reference.{name}: not a topology flag; a reference keeps the case's "
                 f"mathematics and may only name its topology ({known})")
        topology[name] = coerce(name, substitute(raw, variables, fail), fail)
    return topology


def _reference_world(topology: dict, fail) -> int:
    """The processes a reference topology runs on (1: one device)."""
    if not topology:
        return 1
    flags = {"tensor_parallel": topology.get("tensor_parallel", 1),
             "pipeline_parallel": topology.get("pipeline_parallel", 1)}
    counts = {name: (topology[name], ["reference", name])
              for name in ("data_parallel", "nthread_per_process") if name in topology}
    return world_size(flags, counts.get("data_parallel"), counts.get("nthread_per_process"),
                      lambda location: fail)
