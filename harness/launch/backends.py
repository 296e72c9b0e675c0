"""Trainer backends: how a run is launched and how its outputs are read back.

- HarnessBackend: our trainer, its ranks started by the launcher the settings name
  (harness.registry: torchrun, `python -m harness.trainer` for one process and
  `python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d
  --rdzv-endpoint 127.0.0.1:PORT ... -m harness.trainer` for more; or the zygote), whose log
  layout and failure record it reads. Outputs: run.json, steps.jsonl, the gradient dump.
- CommandBackend: another trainer, from an argv template (a list; placeholders in braces, see
  PLACEHOLDERS). It must print InfiniTrain-style step lines and dump `<name>.npy` gradients into
  {gradients_dir}; if it writes our steps.jsonl / run.json into {output_dir} those are used.

Both build argv lists, never shell strings.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from harness import registry
# printed_resolution lives with the judges that use it (torch-free, below the log tool, which
# cannot import launch); re-exported here where the step lines are read.
from harness.compare.baseline import printed_resolution
from harness.contracts.flags import flag_argv
from harness.contracts.rank_exit import FAILURES_ENV, RANK_FAILURES_DIR
from harness.contracts.records import read_json, read_jsonl
from harness.contracts.semantics import BaselineUnmatched
from harness.contracts.trace import Pairing

from .launcher import Launcher, RankRun, rank_with_traceback
from .process import ProcessResult
from .torchrun import TorchrunLauncher

if TYPE_CHECKING:
    from harness.cases import HarnessConfig

PLACEHOLDERS = ("python", "world_size", "port", "output_dir", "gradients_dir", "log_dir",
                "checkpoint", "input_bin", "model", "case", "device", "devices", "flags")
# InfiniTrain's per-step line (harness.trainer prints the same shape).
# (`| norm -1.0000 |` is what InfiniTrain's tiny_mixtral and the PyTorch baselines print
# between the loss and the lr: feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:141-143)
STEP_LINE = re.compile(
    r"step\s+(?P<step>\d+)/(?P<total>\d+)\s*\|\s*train loss\s+(?P<loss>\S+)\s*\|\s*"
    r"(?:norm\s+\S+\s*\|\s*)?lr\s+(?P<lr>\S+)\s*\|\s*\((?P<ms>[\d.]+)\s*ms\s*\|\s*(?P<tps>[\d.]+)\s*tok/s"
    r"(?:\s*\|\s*peak used:\s*(?P<mem>[\d.]+)\s*MB)?")


@dataclass
class LaunchSpec:
    case: str  # the case name, or "reference"
    model: str
    flags: dict[str, Any]
    world_size: int
    checkpoint: Path
    input_bin: Path
    output_dir: Path
    gradients_dir: Path | None
    log_dir: Path
    device: str = "cpu"
    port: int | None = None
    slots: list[int] = field(default_factory=list)
    # A per-group launch's process count (InfiniTrain's infini_run_args: world_size is these
    # processes times each one's threads); 0: the trainer's own launch mode decides.
    launcher_processes: int = 0


@dataclass
class RunOutputs:
    steps: list[dict]
    gradients_dir: Path | None
    run_record: dict | None
    # What went wrong although the launcher may have exited 0 (a fatal log line, a rejected
    # flag, missing steps), in one line; None when the outputs are whole.
    problem: str | None = None


class TrainerBackend(Protocol):
    """What the case runner asks of a trainer, declared in full (no backend is probed for a
    method it may lack)."""

    name: str  # its registry name (harness.registry)

    def version(self) -> str: ...

    def identities(self) -> dict[str, str] | None:
        """How each of its binaries was identified (model -> `elf`, `script -> /path`), for the
        session header; None for a trainer without binaries of its own."""

    def unsupported(self, model: str, flags: dict, world_size: int) -> str | None:
        """Why this trainer build cannot run these flags at all (the case is skipped with it),
        learned from the trainer itself before anything launches; None when it can."""

    def gradients_unavailable(self, model: str, flags: dict) -> str | None:
        """Why a run of these flags gives no comparable gradients, or None."""

    def gradient_shards(self, flags: dict) -> int:
        """1 when the dump holds whole gradients; else the TP degree its un-gathered shards
        are cut by (harness.compare.tp_shards)."""

    def first_step(self, flags: dict) -> int:
        """The first step a run of these flags prints (a resumed run starts later)."""

    def trace_unavailable(self, model: str, flags: dict) -> str | None:
        """Why a run of these flags cannot write a module-level trace (InfiniTrain's
        `--precision_check`, harness.contracts.trace), learned from the trainer itself; None
        when it can."""

    def trace_pairing(self, model: str) -> Pairing | None:
        """How this trainer's module names map onto the bundled trainer's (a foreign
        program's facts, harness.contracts.trace); None for the bundled trainer itself."""

    def baseline_flags(self, model: str, flags: dict) -> dict:
        """The bundled PyTorch trainer's flags (its `model`, the family, among them) that
        compute what this trainer computes for these case flags, on one device (the live
        baseline, harness.baseline); raises
        harness.contracts.semantics.BaselineUnmatched with the reason where none can."""

    def launch(self, spec: LaunchSpec, settings) -> ProcessResult:
        """Run it on this machine (harness.launch.placement sends several nodes and Slurm
        elsewhere)."""

    def command(self, spec: LaunchSpec) -> list[str]: ...

    def environment(self, spec: LaunchSpec) -> dict[str, str]: ...

    def collect(self, spec: LaunchSpec, result: ProcessResult) -> RunOutputs: ...

    def rank_logs(self, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]: ...

    def failing_rank(self, spec: LaunchSpec, result: ProcessResult) -> str | None: ...

    def working_dir(self, spec: LaunchSpec) -> Path | None: ...


def base_environment(spec: LaunchSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    env["HARNESS_CASE"] = spec.case
    env["HARNESS_DEVICE_SLOTS"] = ",".join(map(str, spec.slots))
    if spec.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.slots))
    else:
        # One process per virtual device: keep each to one thread, or N ranks fight for cores.
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_command(backend: TrainerBackend, spec: LaunchSpec, settings) -> ProcessResult:
    """A backend's command, in its working folder, with the session's timeout."""
    from .process import run_process

    return run_process(backend.command(spec), backend.environment(spec), settings.timeout_s,
                       spec.log_dir / "launcher.stdout", spec.log_dir / "launcher.stderr",
                       cwd=backend.working_dir(spec))


class WholeGradientsFromStart:
    """The answers of a trainer that runs whatever flags it is given from step 1 and dumps
    whole (gathered) gradients: the bundled trainer, and a command trainer by its contract."""

    def identities(self) -> dict[str, str] | None:
        return None

    def unsupported(self, model: str, flags: dict, world_size: int) -> str | None:
        return None

    def gradients_unavailable(self, model: str, flags: dict) -> str | None:
        return None

    def gradient_shards(self, flags: dict) -> int:
        return 1

    def first_step(self, flags: dict) -> int:
        return 1

    def trace_unavailable(self, model: str, flags: dict) -> str | None:
        return None  # the bundled trainer writes --precision_check's trace

    def trace_pairing(self, model: str) -> Pairing | None:
        return None

    def baseline_flags(self, model: str, flags: dict) -> dict:
        raise BaselineUnmatched(f"the {self.name} trainer has no recorded semantics to run the "
                                f"bundled PyTorch trainer with (InfiniTrain's binaries have: "
                                f"harness.contracts.semantics)")


def logged_text(result: ProcessResult, logs: list[Path]) -> str:
    """What a run printed: its stderr, its stdout and each log file, in that order. Step lines
    are read from all of them: InfiniTrain and a Python trainer that logs with `logging` print
    them on stderr, others on stdout or into their own log files."""
    parts = []
    for path in [result.stderr, result.stdout, *logs]:
        try:
            parts.append(path.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(parts)


def parse_step_lines(text: str) -> list[dict]:
    """Step records from InfiniTrain-style log lines (the last line per step wins).

    `loss_resolution` is one unit in the last place of the loss as printed (`10**-decimals`:
    InfiniTrain's `{:.6f}` gives 1e-6; None for a loss that is not a number, like `-nan`): two
    equal runs can differ by that much in print, so the comparison does not count a difference
    within it (harness.compare.diff.compare_losses). `lr_resolution` is the same for the
    printed lr (`{:.2e}`: 1e-8 at 1.00e-05; 0.0 for `0.00e+00`, an exact zero), which
    harness.compare.baseline.judge_lr compares within. Steps read from a steps.jsonl at full
    precision have neither field."""
    steps: dict[int, dict] = {}
    for match in STEP_LINE.finditer(text):
        try:
            loss = float(match["loss"])
        except ValueError:
            loss = math.nan
        steps[int(match["step"])] = {
            "step": int(match["step"]), "loss": loss, "lr": _float(match["lr"]),
            "step_time_ms": _float(match["ms"]), "tokens_per_s": _float(match["tps"]),
            "peak_memory_mb": _float(match["mem"]) if match["mem"] else None,
            "loss_resolution": printed_resolution(match["loss"]),
            "lr_resolution": printed_resolution(match["lr"]),
        }
    return [steps[s] for s in sorted(steps)]


def _float(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan



def registered_launcher(name: str) -> Launcher:
    """The launcher registered as `name` (harness.registry.LAUNCHERS), made afresh (a launcher
    holds no run's state)."""
    return registry.resolve(registry.LAUNCHERS, name, "launcher")()


def backend_factory(name: str) -> Callable[[HarnessConfig, Path | None], TrainerBackend]:
    """The factory of the trainer backend registered as `name`
    (harness.registry.TRAINER_BACKENDS)."""
    return registry.resolve(registry.TRAINER_BACKENDS, name, "trainer backend")

class LauncherRanks(ABC):
    """The answers of a trainer whose ranks a registered launcher starts (the one
    settings.launcher names, harness.registry): launching, and the rank logs and failure
    record of the launcher that ran a result (ProcessResult.launcher). A backend that mixes it
    in says what each rank runs in `rank_run`."""

    # Whose layout a result that names no launcher has: the runs harness.launch.placement
    # sends to several nodes or to Slurm are torchrun agents.
    default_launcher = TorchrunLauncher.name

    @abstractmethod
    def rank_run(self, spec: LaunchSpec, timeout_s: float) -> RankRun:
        """What the run's ranks run, as a launcher is asked to start them."""

    def launch(self, spec: LaunchSpec, settings) -> ProcessResult:
        """Run it with the launcher settings.launcher names."""
        run = self.rank_run(spec, settings.timeout_s)
        return registered_launcher(settings.launcher).launch(run)

    def launcher_of(self, result: ProcessResult) -> Launcher:
        """The launcher that ran `result`, whose logs and failure record it has."""
        return registered_launcher(result.launcher or self.default_launcher)

    def rank_logs(self, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]:
        return self.launcher_of(result).rank_logs(spec.log_dir, result)

    def failing_rank(self, spec: LaunchSpec, result: ProcessResult) -> str | None:
        return self.launcher_of(result).failing_rank(spec.log_dir, result)


class HarnessBackend(LauncherRanks, WholeGradientsFromStart):
    """Our reference trainer, its ranks started by the launcher settings.launcher names
    (torchrun, or the pre-warmed zygote); its log layout and failure record are that
    launcher's."""

    name = "harness"
    module = "harness.trainer"  # what each rank runs, as `python -m harness.trainer`

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(env or {})
        self._version: str | None = None

    @classmethod
    def from_config(cls, config: HarnessConfig, facts_dir: Path | None = None) -> HarnessBackend:
        return cls(env=dict(config.trainer.env))

    def version(self) -> str:
        """The trainer's identity for the reference cache: a digest of every harness module
        the trainer process can run (harness.launch.trainer_sources) and the torch version,
        so any change to that code invalidates references."""
        if self._version is None:
            from importlib.metadata import PackageNotFoundError, version

            from .trainer_sources import source_digest, trainer_files

            try:
                torch_version = version("torch")
            except PackageNotFoundError:
                torch_version = "none"
            self._version = f"harness-{source_digest(trainer_files())}-torch-{torch_version}"
        return self._version

    def trainer_args(self, spec: LaunchSpec) -> list[str]:
        trainer = flag_argv(spec.flags) + [
            f"--device={spec.device}",
            f"--llmc_filepath={spec.checkpoint}",
            f"--input_bin={spec.input_bin}",
            f"--output_dir={spec.output_dir}",
        ]
        if spec.gradients_dir is not None:
            trainer.append(f"--dump_gradients={spec.gradients_dir}")
        return trainer

    def rank_run(self, spec: LaunchSpec, timeout_s: float) -> RankRun:
        """The run's ranks as a launcher is asked to start them."""
        return RankRun(self.module, tuple(self.trainer_args(spec)), spec.world_size, spec.port,
                       self.environment(spec), spec.log_dir, timeout_s, self.working_dir(spec))

    def command(self, spec: LaunchSpec) -> list[str]:
        """torchrun's command (one process: `python -m harness.trainer`), the form a scheduler's
        job runs."""
        return TorchrunLauncher().command(self.rank_run(spec, 0.0))

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        env = base_environment(spec, self.env)
        env[FAILURES_ENV] = str(spec.log_dir / RANK_FAILURES_DIR)  # harness.contracts.rank_exit
        return env

    def working_dir(self, spec: LaunchSpec) -> Path | None:
        return None

    def collect(self, spec: LaunchSpec, result: ProcessResult) -> RunOutputs:
        return RunOutputs(
            steps=read_jsonl(spec.output_dir / "steps.jsonl"),
            gradients_dir=spec.gradients_dir,
            run_record=read_json(spec.output_dir / "run.json"),
        )


class CommandBackend(WholeGradientsFromStart):
    """Another trainer, from an argv template: each item is formatted with the placeholders
    (PLACEHOLDERS); an item that is exactly "{flags}" becomes one `--name=value` item per flag.
    The command launches all its processes itself, given {world_size} and {port}."""

    name = "command"

    def __init__(self, template: list[str] | tuple[str, ...], version: str | None = None,
                 env: dict[str, str] | None = None, base_dir: Path | None = None) -> None:
        self.template = list(template)
        self.env = dict(env or {})
        self.base_dir = base_dir
        self._version = version
        for item in self.template:
            for name in re.findall(r"{(\w*)}", item):
                if name not in PLACEHOLDERS:
                    raise ValueError(f"command template item {item!r}: unknown placeholder "
                                     f"{{{name}}}; expected one of {', '.join(PLACEHOLDERS)}")

    @classmethod
    def from_config(cls, config: HarnessConfig, facts_dir: Path | None = None) -> CommandBackend:
        spec = config.trainer
        return cls(spec.command, version=spec.version, env=dict(spec.env),
                   base_dir=config.path.parent)

    def version(self) -> str:
        """The configured version, else a hash of the template and of every file it names."""
        if self._version is None:
            digest = hashlib.sha256(json.dumps(self.template).encode())
            for item in self.template:
                path = Path(item) if Path(item).is_absolute() or self.base_dir is None \
                    else self.base_dir / item
                if "{" not in item and path.is_file():
                    digest.update(path.read_bytes())
            self._version = f"command-{digest.hexdigest()[:16]}"
        return self._version

    def command(self, spec: LaunchSpec) -> list[str]:
        values = {
            "python": sys.executable, "world_size": spec.world_size, "port": spec.port or 0,
            "output_dir": spec.output_dir, "log_dir": spec.log_dir,
            "gradients_dir": spec.gradients_dir or "", "checkpoint": spec.checkpoint,
            "input_bin": spec.input_bin, "model": spec.model, "case": spec.case,
            "device": spec.device, "devices": ",".join(map(str, spec.slots)),
        }
        argv = []
        for item in self.template:
            if item == "{flags}":
                argv.extend(flag_argv(spec.flags))
            else:
                argv.append(item.format_map(values))
        return argv

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return base_environment(spec, self.env)

    def working_dir(self, spec: LaunchSpec) -> Path | None:
        return None

    def launch(self, spec: LaunchSpec, settings) -> ProcessResult:
        return run_command(self, spec, settings)

    def trace_unavailable(self, model: str, flags: dict) -> str | None:
        return ("a command trainer's contract has no module-level trace (InfiniTrain's "
                "--precision_check)")

    def collect(self, spec: LaunchSpec, result: ProcessResult) -> RunOutputs:
        steps = read_jsonl(spec.output_dir / "steps.jsonl")
        if not steps:
            steps = parse_step_lines(logged_text(result, sorted(spec.log_dir.glob("**/*.log"))))
        return RunOutputs(steps=steps, gradients_dir=spec.gradients_dir,
                          run_record=read_json(spec.output_dir / "run.json"))

    def rank_logs(self, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]:
        logs: dict[str, list[Path]] = {}
        for path in sorted(spec.log_dir.glob("**/*.log")):
            match = re.search(r"rank[_-]?(\d+)", path.name) or re.search(r"(\d+)", path.parent.name)
            logs.setdefault(match.group(1) if match else path.stem, []).append(path)
        return logs

    def failing_rank(self, spec: LaunchSpec, result: ProcessResult) -> str | None:
        return rank_with_traceback(self.rank_logs(spec, result))
