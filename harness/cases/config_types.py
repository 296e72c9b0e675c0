"""The loaded config's types: what a case compares, model files, assets, the trainer, one
expanded case, and the whole config (the tolerance type is harness.contracts.tolerance's). Each
checks itself on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contracts.flags import (
    FLAG_TABLE,
    HARNESS,
    NO_DECLARED_ROLES,
    DeclaredRoles,
    reference_args,
    role_of,
    unknown_to,
)
from harness.contracts.tolerance import Tolerance, Tolerances  # noqa: F401  (HarnessConfig's field type)
from harness.registry import backend_names


@dataclass(frozen=True)
class Compare:
    loss: bool = True
    gradients: bool = True

    def __post_init__(self) -> None:
        if not (self.loss or self.gradients):
            raise ValueError("compares nothing; expected `loss` or `gradients` to be true")

    def to_dict(self) -> dict:
        return {"loss": self.loss, "gradients": self.gradients}


@dataclass(frozen=True)
class ModelFiles:
    """A model's checkpoint and token file; both None means the built-in synthetic assets."""

    checkpoint: Path | None = None
    input_bin: Path | None = None
    variables: tuple[str, ...] = ()  # the @VAR@ names they came from, for error messages

    @property
    def synthetic(self) -> bool:
        return self.checkpoint is None


@dataclass(frozen=True)
class Assets:
    preset: str = "tiny"
    seed: int = 0
    dir: Path | None = None


# The trainer backends registered when this module is imported (harness.registry), for
# what is built once from them (--harness-trainer's choices, the shipped schema); a config is
# checked against those registered at the time (TrainerSpec).
BACKENDS = backend_names()
# InfiniTrain's launch modes: threads (one process, --nthread_per_process N) or infini_run
INFINITRAIN_LAUNCHES = ("threads", "infini_run")


@dataclass(frozen=True)
class Overrides:
    """What the command line says over the config file: variables (`--harness-var`), the
    trainer backend (`--harness-trainer`), InfiniTrain's build folder and launch mode."""

    variables: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    build_dir: str | None = None
    launch: str | None = None
    # NAME=ROLE items of --harness-flag-role: roles of flags the flag table does not know
    flag_roles: tuple[str, ...] = ()

    @classmethod
    def parse_variables(cls, items) -> dict[str, str]:
        """NAME=VALUE items, or ValueError naming the bad one."""
        variables = {}
        for item in items or ():
            name, sep, value = item.partition("=")
            if not sep or not name.isidentifier():
                raise ValueError(f"--harness-var {item!r}: expected NAME=VALUE")
            variables[name] = value
        return variables


@dataclass(frozen=True)
class TrainerSpec:
    """Which trainer runs the cases: ours (`harness`), a command template (`command`), or
    InfiniTrain's binaries from a build folder (`infinitrain`)."""

    backend: str = "harness"
    command: tuple[str, ...] = ()
    version: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    build_dir: Path | None = None  # infinitrain: the build folder
    launch: str = "threads"  # infinitrain: threads (one process) or infini_run
    # Where build_dir came from, for messages: --infinitrain-build, trainer.build, or the
    # config's BUILD_DIR variable (InfiniTrain's own config names its build that way).
    build_source: str = "--infinitrain-build"
    # infinitrain: the word passed as `--device` on an accelerator (the config's DEVICE_BACKEND
    # variable, as InfiniTrain's runner passes it; harness.contracts.programs RUNNER)
    device_backend: str = "cuda"

    def __post_init__(self) -> None:
        if self.backend not in backend_names():
            raise ValueError(f"backend is {self.backend!r}; expected one of "
                             f"{', '.join(backend_names())}")
        if self.backend == "command" and not self.command:
            raise ValueError("backend 'command' needs a `command` template (a list of strings)")
        if self.backend == "infinitrain" and self.build_dir is None:
            raise ValueError("backend 'infinitrain' needs InfiniTrain's build folder "
                             "(--infinitrain-build, `trainer.build`, or the BUILD_DIR variable)")
        if self.launch not in INFINITRAIN_LAUNCHES:
            raise ValueError(f"launch is {self.launch!r}; expected "
                             f"{' or '.join(INFINITRAIN_LAUNCHES)}")
        if not self.device_backend or not self.device_backend.isidentifier():
            raise ValueError(f"device backend {self.device_backend!r}: expected a device word "
                             f"such as cuda or maca")


@dataclass(frozen=True)
class Case:
    """One (tag, case, model): what a pytest item runs."""

    tag: str
    case_id: str
    model: str
    flags: dict[str, Any]  # trainer flags (resolved hyper-parameters + the case's own)
    world_size: int
    tolerances: Tolerances
    compare: Compare
    source: str  # e.g. "test_groups[1].tests[3]"
    description: str = ""
    # The flags exactly as the config says (defaults < group < case, @VAR@ substituted, typed;
    # a foreign trainer's own flags as written): what a foreign trainer is launched with.
    args: dict[str, Any] = field(default_factory=dict)
    # The reference's topology where one device cannot hold the model (e.g. tensor_parallel
    # 8): {} is the single-device reference. Topology flags only.
    reference_topology: dict[str, Any] = field(default_factory=dict)
    reference_world_size: int = 1
    # Roles declared for flags the flag table does not know (the reference rule reads them).
    declared: DeclaredRoles = NO_DECLARED_ROLES
    # Why the case cannot run at all, known from the config alone (a program the harness has
    # no facts for); "" when it can.
    skip: str = ""
    # Its group's `infini_run_args.nproc_per_node`: InfiniTrain runs it through infini_run with
    # that many processes (each with the case's nthread_per_process threads); 0: the trainer's
    # launch mode decides. Its reference is still one device.
    launcher_processes: int = 0

    def __post_init__(self) -> None:
        need = self.pp * self.tp * self.cp
        if self.world_size < 1 or self.world_size % need:
            raise ValueError(f"world size {self.world_size} is not a multiple of "
                             f"tensor_parallel * context_parallel * pipeline_parallel = {need}")

    @property
    def name(self) -> str:
        """The pytest name: `tag/model/id`, stable and readable."""
        return f"{self.tag}/{self.model}/{self.case_id}"

    @property
    def pp(self) -> int:
        return int(self.flags.get("pipeline_parallel", 1))

    @property
    def tp(self) -> int:
        return int(self.flags.get("tensor_parallel", 1))

    @property
    def cp(self) -> int:
        """Context parallelism (InfiniTrain's feat/context_parallel): world = DP x TP x CP x PP."""
        return int(self.args.get("context_parallel", 1))

    @property
    def vpp(self) -> int:
        return int(self.flags.get("virtual_pipeline_parallel", 1))

    @property
    def dp(self) -> int:
        return self.world_size // (self.pp * self.tp * self.cp)

    @property
    def unsupported(self) -> tuple[str, ...]:
        """The case's flags the bundled trainer does not have (it runs nthread_per_process as
        a process count)."""
        return tuple(n for n in unknown_to(HARNESS, self.args) if n != "nthread_per_process")

    @property
    def passthrough(self) -> tuple[str, ...]:
        """The case's flags the flag table does not know: passed to a foreign trainer as
        written, and kept in its reference unless a declared role drops them."""
        return tuple(n for n in self.args if n not in FLAG_TABLE)

    def assumed(self) -> dict[str, str]:
        """Each flag the table does not know, with the role it is taken for (declared, else
        assumed mathematics)."""
        return {n: role_of(n, self.declared) for n in self.passthrough}

    def reference_flags(self) -> dict[str, Any]:
        """The bundled trainer's reference flags: the resolved flags minus the topology."""
        return reference_args(self.flags)

    def reference_args(self) -> dict[str, Any]:
        """A foreign trainer's reference flags: the case's own flags minus the topology
        (and output, resume, memory); every flag that changes the mathematics stays."""
        return reference_args(self.args, self.declared)


@dataclass(frozen=True)
class HarnessConfig:
    path: Path
    variables: dict[str, Any]
    models: tuple[str, ...]
    model_files: dict[str, ModelFiles]
    assets: Assets
    trainer: TrainerSpec
    tags: tuple[str, ...]
    cases: tuple[Case, ...]
    # What the session summary names once: InfiniTrain keys set aside, builds recorded, flags
    # the table does not know with the role taken, a groups variable naming a missing tag.
    notes: tuple[str, ...] = ()

    def files_for(self, model: str) -> ModelFiles:
        return self.model_files.get(model, ModelFiles())
