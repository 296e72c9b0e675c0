"""A HarnessConfig from a schema-valid document: its variables, model files, assets and trainer
here; its cases from expand.py."""

from __future__ import annotations

from pathlib import Path

from harness.contracts.flags import NO_DECLARED_ROLES, DeclaredRoles, FlagError
from harness.contracts.models import MODEL_SPECS
from harness.contracts.programs import PROGRAMS, RUNNER, GroupsError, plan_tags

from .config_types import Assets, HarnessConfig, ModelFiles, Overrides, TrainerSpec
from .errors import failer_for
from .expand import expand_cases
from .args import substitute

# the registered model families a config that names none runs (ModelSpec.in_default_cases)
DEFAULT_MODELS = tuple(s.name for s in MODEL_SPECS.values() if s.in_default_cases)


def infinitrain_shaped(data) -> bool:
    """A config of InfiniTrain's own shape: its variables name InfiniTrain's BUILD_DIR (as
    every branch's scripts/test_config.json does)."""
    return isinstance(data, dict) and isinstance(data.get("variables"), dict) \
        and "BUILD_DIR" in data["variables"]


def build_config(path: Path, data: dict, overrides: Overrides | None = None,
                 foreign: tuple[str, ...] = ()) -> HarnessConfig:
    """`foreign`: the top-level keys of InfiniTrain's own that the loader set aside
    (load.set_aside_foreign_keys), named once in the notes."""
    failer = failer_for(path, data)
    overrides = overrides or Overrides()
    variables = {**data.get("variables", {}), **overrides.variables}
    base_dir = path.parent
    models = tuple(data.get("models", DEFAULT_MODELS))
    declared = _declared_roles(data, overrides, failer)

    model_files = {}
    for model, spec in data.get("model_files", {}).items():
        entries = {}
        for role in ("checkpoint", "input_bin"):
            where = ["model_files", model, role]
            text = substitute(spec[role], variables, failer(where))
            if not isinstance(text, str) or not text:
                failer(where)(f"{text!r} is not a file path")
            entries[role] = (base_dir / text) if not Path(text).is_absolute() else Path(text)
        model_files[model] = ModelFiles(**entries)
    trainer_spec = data.get("trainer", {})
    backend = overrides.backend or trainer_spec.get("backend") or \
        ("infinitrain" if "BUILD_DIR" in variables else "harness")
    # InfiniTrain's own config lists no models: its runner decides which program runs which
    # tag (harness.contracts.programs).
    build, source = overrides.build_dir, "--infinitrain-build"
    if not build and trainer_spec.get("build"):
        build, source = trainer_spec["build"], "trainer.build"
    if not build and backend == "infinitrain" and variables.get("BUILD_DIR"):
        build, source = variables["BUILD_DIR"], "variable BUILD_DIR"
    build_dir = _path(base_dir, str(build)) if build else None
    try:
        # which of a renamed program's binaries runs (mixtral, tiny_mixtral) is the build's
        tag_plan = plan_tags(_tags(data), variables, str(path), _binary_check(build_dir)) \
            if backend == "infinitrain" and "models" not in data else None
    except GroupsError as error:
        failer(["variables"])(str(error))
    programs = tuple(dict.fromkeys(p for ps in tag_plan.programs_by_tag.values() for p in ps)) \
        if tag_plan else models
    for model in programs:  # InfiniTrain's scripts name them <PREFIX>_LLMC_FILEPATH / _INPUT_BIN
        prefix = PROGRAMS[model].variable_prefix if model in PROGRAMS else model.upper()
        names = {"checkpoint": f"{prefix}_LLMC_FILEPATH", "input_bin": f"{prefix}_INPUT_BIN"}
        if model not in model_files and all(variables.get(n) for n in names.values()):
            model_files[model] = ModelFiles(**{
                role: _path(base_dir, str(variables[name])) for role, name in names.items()},
                variables=tuple(names.values()))

    assets_spec = data.get("assets", {})
    assets = Assets(
        # InfiniTrain's loaders refuse the tiny preset's files (docs/infinitrain.md)
        preset=assets_spec.get("preset", "infinitrain" if backend == "infinitrain" else "tiny"),
        seed=assets_spec.get("seed", 0),
        dir=(base_dir / assets_spec["dir"]) if "dir" in assets_spec else None,
    )
    device_variable = RUNNER.device_variable
    device_backend = str(variables.get(device_variable) or RUNNER.device_default)
    try:
        trainer = TrainerSpec(
            backend=backend,
            command=tuple(substitute(item, variables, failer(["trainer", "command"]))
                          for item in trainer_spec.get("command", ())),
            version=trainer_spec.get("version"),
            env=tuple(sorted(trainer_spec.get("env", {}).items())),
            build_dir=build_dir,
            launch=overrides.launch or trainer_spec.get("launch", "threads"),
            build_source=source,
            device_backend=device_backend,
        )
    except ValueError as error:
        failer(["variables", device_variable] if device_variable in variables
               else ["trainer"])(str(error))

    tags, cases = expand_cases(data, variables, models, failer, declared,
                               tag_plan.programs_by_tag if tag_plan else None,
                               shell=infinitrain_shaped(data))
    notes = [f"{path}: top-level key {key!r} is InfiniTrain's own: not used by the harness"
             for key in foreign]
    for key in ("basic_compile_commands", "builds"):
        if data.get(key):
            ids = ", ".join(str(b.get("id", "?")) if isinstance(b, dict) else "?"
                            for b in data[key])
            notes.append(f"{path}: {key} ({ids}): recorded, not run: the harness tests the "
                         f"build folder it is given")
    notes += tag_plan.notes if tag_plan else ()
    if device_variable in variables and backend == "infinitrain":
        notes.append(f"{path}: variable {device_variable}={device_backend!r}: InfiniTrain's "
                     f"binaries get --device {device_backend} on an accelerator, as its runner "
                     f"passes it ({RUNNER.source('device_variable').split(';')[0]}); a CPU run "
                     f"passes --device cpu")
    notes += group_launch_notes(path, data, cases)
    notes += unknown_flag_notes(cases, declared)
    return HarnessConfig(path=path, variables=variables, models=programs,
                         model_files=model_files, assets=assets, trainer=trainer, tags=tags,
                         cases=cases, notes=tuple(notes))


def _binary_check(build_dir: Path | None):
    """Whether the build folder holds a binary of that name (None: no folder, or not there
    yet: the facts' older program then stands)."""
    if build_dir is None or not build_dir.is_dir():
        return None
    return lambda name: (build_dir / name).is_file()


def _tags(data: dict) -> tuple[str, ...]:
    return tuple(dict.fromkeys(group["tag"] for group in data["test_groups"]))


def _declared_roles(data: dict, overrides: Overrides, failer) -> DeclaredRoles:
    """The config's `flag_roles` under the command line's --harness-flag-role."""
    try:
        from_file = DeclaredRoles.parse(data.get("flag_roles", {}), "flag_roles:") \
            if data.get("flag_roles") else NO_DECLARED_ROLES
    except FlagError as error:
        failer(["flag_roles"])(str(error))
    try:
        return DeclaredRoles.parse(overrides.flag_roles, "--harness-flag-role").over(from_file) \
            if overrides.flag_roles else from_file
    except FlagError as error:
        failer([])(str(error))


def group_launch_notes(path: Path, data: dict, cases) -> list[str]:
    """One line per group launched through infini_run (its `infini_run_args`): how the harness
    launches it, and that its reference is still one device."""
    notes = []
    for tag in dict.fromkeys(c.tag for c in cases if c.launcher_processes):
        group = [c for c in cases if c.tag == tag and c.launcher_processes]
        processes = sorted({c.launcher_processes for c in group})
        notes.append(
            f"{path}: tag {tag!r}: infini_run_args {{\"nproc_per_node\": "
            f"{', '.join(map(str, processes))}}}: its {len(group)} case(s) run through "
            f"`infini_run --nproc_per_node=N -- ./<program>` (the harness keeps the `--` that "
            f"InfiniTrain's runner leaves out: without it infini_run's gflags reads the "
            f"program's flags as its own); each compared with its one-device reference")
    return notes


def unknown_flag_notes(cases, declared: DeclaredRoles) -> list[str]:
    """One line per flag the flag table does not know: its cases, the role taken, and what
    that does to their references."""
    uses: dict[str, list] = {}
    for case in cases:
        for name in case.passthrough:
            uses.setdefault(name, []).append(case)
    notes = []
    for name, users in uses.items():
        shown = ", ".join(c.name for c in users[:3]) + (f" and {len(users) - 3} more"
                                                         if len(users) > 3 else "")
        if name in declared.roles:
            role = declared.roles[name]
            kept = role == "mathematics"
            notes.append(f"flag --{name} ({shown}): not in the flag table; role {role!r} as "
                         f"declared by {declared.origin[name]}: "
                         + ("kept in each reference" if kept else "dropped by each reference"))
            continue
        notes.append(
            f"flag --{name} ({shown}): not in the flag table; assumed mathematics, so kept in "
            f"each case's single-device reference: were it topology, the reference would run "
            f"it on one device (a binary may refuse that), were it memory, the case would be "
            f"compared with a run of itself. Declare its role with --harness-flag-role "
            f"{name}=ROLE or the config's flag_roles (roles: mathematics, topology, output, "
            f"resume, memory)")
    return notes


def _path(base_dir: Path, text: str) -> Path:
    """A config path: absolute as written, else relative to the config's folder (as
    InfiniTrain's scripts resolve BUILD_DIR from their own folder)."""
    return Path(text) if Path(text).is_absolute() else (base_dir / text)
