"""The harness's option table (Options), what a CaseRunner is given (Settings) and what it
returns for a case (Outcome).

Every harness option is a field of `Options`: its flag, type, choices, metavar and help are the
field's metadata and its default is the field's default, and harness/plugin.py declares the
options from here (`declarations`) and reads them back here (`Options.from_pytest`), never by
name. A session's Settings are derived from its Options in one place, `Settings.derive`: the
fields of the same name are copied, and what is derived rather than given is resolved: the
device kind (`auto` is CUDA when present), the device slots (default: the CUDA devices, or the
CPU cores), the launcher (`auto`: the zygote on CPU) and where the leases live.
`Settings.record` is the session header's `settings` block (harness.results.session).
"""

from __future__ import annotations

import glob
import os
import shlex
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from harness.cases.config_types import BACKENDS, INFINITRAIN_LAUNCHES, Overrides
from harness.cases.node_ids import parse_case_patterns
from harness.registry import launcher_names

# How the bundled trainer's ranks start: the launchers registered in harness.registry;
# --harness-launcher also takes `auto`, resolved in Settings.derive.
LAUNCHERS = launcher_names()
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Option:
    """One pytest option as pytest_addoption is given it (the default is the field's)."""

    flag: str
    help: str
    metavar: str | None = None
    type: type | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None  # store_true, append
    # Declared after pytest's first parse (harness/plugin.py, pytest_load_initial_conftests,
    # says why): an option whose value starts with "--".
    late: bool = False

    def __post_init__(self) -> None:
        if self.type not in (None, *_ACCEPTED) or self.action not in (None, "store_true",
                                                                      "append"):
            raise ValueError(f"option {self.flag}: type {self.type!r}, action {self.action!r}; "
                             f"expected a type of None, int, float and an action of None, "
                             f"store_true, append")
        if self.choices is not None and not isinstance(self.choices, tuple):
            raise ValueError(f"option {self.flag}: choices {self.choices!r}; expected a tuple")


@dataclass(frozen=True)
class Selected:
    """One of pytest's own options a session's settings record (not declared by the harness)."""

    flag: str  # as written on the command line: -n, -m, -k
    dest: str  # pytest's name for it (config.getoption(dest))


# An option's type: what its value may be (a float option takes a whole number too) and how
# the message says it.
_ACCEPTED = {int: int, float: (int, float)}
_EXPECTED = {int: "an integer", float: "a number"}


def _option(flag: str, default: Any, help: str, **more) -> Any:
    return field(default=default, metadata={"option": Option(flag, help, **more)})


def _selected(flag: str, dest: str) -> Any:
    return field(default=None, metadata={"selected": Selected(flag, dest)})


@dataclass(frozen=True)
class Options:
    """Every harness option as the command line gave it (None where not given and the option
    has no default): the one place each is written. The fields Settings has too share its names;
    the rest are the session's (config, output folders, the trainer under test)."""

    slots: int | None = _option(
        "--gpus", None, metavar="N", type=int,
        help="devices the run may use; cases needing more are skipped "
             "(default: the CUDA devices, or on CPU the CPU cores)")
    config: str | None = _option(
        "--harness-config", None, metavar="PATH",
        help="test config (default: configs/test_config.json under the rootdir)")
    output: str | None = _option(
        "--harness-output", None, metavar="DIR",
        help="where sessions write runs and results (default: $HARNESS_OUTPUT, "
             "else reports/harness under the rootdir)")
    reference_cache: str | None = _option(
        "--harness-reference-cache", None, metavar="DIR",
        help="single-device reference cache (default: <output>/reference-cache)")
    timeout_s: float = _option(
        "--harness-timeout", 900.0, metavar="SECONDS", type=float,
        help="per-run timeout; a run past it is killed with all its processes (default 900)")
    device: str = _option(
        "--harness-device", "auto", choices=("auto", *DEVICES),
        help="cuda, cpu (gloo, one process per device slot), or auto")
    trainer: str | None = _option(
        "--harness-trainer", None, choices=BACKENDS,
        help="the trainer under test (default: the config's `trainer.backend`, else the "
             "bundled trainer)")
    variables: tuple[str, ...] = _option(
        "--harness-var", (), metavar="NAME=VALUE", action="append",
        help="set a config variable (@NAME@), over the file's `variables`")
    cases: str | None = _option(
        "--harness-cases", None, metavar="PATTERNS",
        help="run only the cases whose tag/model/id matches one of these comma-separated "
             "patterns (globs per part: basic/gpt2/1,basic/*/4); unlike -k, only the case's "
             "own name is matched, never the folders above it")
    flag_roles: tuple[str, ...] = _option(
        "--harness-flag-role", (), metavar="NAME=ROLE", action="append",
        help="the role of a trainer flag the harness does not know (mathematics, topology, "
             "output, resume, memory): topology, output, resume and memory are dropped by the "
             "reference (docs/infinitrain_branches.md); over the config's `flag_roles`")
    golden_dir: str | None = _option(
        "--harness-golden", None, metavar="DIR",
        help="compare against the golden records in DIR instead of running references "
             "(docs/harness_guide.md, Golden records)")
    golden_write_dir: str | None = _option(
        "--harness-golden-write", None, metavar="DIR",
        help="record every reference this session uses as a golden record in DIR")
    golden_allow_mismatch: bool = _option(
        "--harness-golden-allow-mismatch", False, action="store_true",
        help="use golden records made in another environment (the mismatch is recorded); "
             "without it such a golden is an error")
    infinitrain_build: str | None = _option(
        "--infinitrain-build", None, metavar="DIR",
        help="InfiniTrain's build folder, holding gpt2, llama3 and infini_run "
             "(default: the config's BUILD_DIR variable, from the config's folder)")
    infinitrain_launch: str | None = _option(
        "--infinitrain-launch", None, choices=INFINITRAIN_LAUNCHES,
        help="threads: one process with --nthread_per_process N (InfiniTrain's scripts, the "
             "default); infini_run: one process per device")
    launcher: str = _option(
        "--harness-launcher", "auto", choices=("auto", *LAUNCHERS),
        help="how the bundled trainer's ranks start: torchrun, zygote (forked from a process "
             "that imported torch once; harness.launch.zygote), or auto (zygote on CPU, "
             "torchrun on CUDA)")
    keep_dumps: str = _option(
        "--harness-keep-dumps", "failed", choices=("failed", "all", "none"),
        help="gradient dumps kept once diffed: failing cases' (default), all, none; every "
             "parameter's summary stays in the record")
    trace: str = _option(
        "--harness-trace", "failed", choices=("failed", "all", "none"),
        help="which cases get a module-level trace (every module's output and gradient at one "
             "step, the case's run against its partner's, named at the first module that "
             "differs; docs/traces.md): failed cases (default), all, or none (no trace at "
             "all: also no step-1 module check in --harness-baseline pytorch)")
    nnodes: int = _option(
        "--harness-nnodes", 1, metavar="N", type=int,
        help="the most nodes a case may span: one torchrun agent per node, joined by a c10d "
             "rendezvous; locally the nodes are agents on this machine "
             "(harness.launch.multinode; default 1)")
    nproc_per_node: int | None = _option(
        "--harness-nproc-per-node", None, metavar="P", type=int,
        help="processes (devices) per node; a case of W ranks spans ceil(W / P) nodes "
             "(default: --gpus over --harness-nnodes; on Slurm --gpus)")
    scheduler: str = _option(
        "--harness-scheduler", "local", choices=("local", "slurm"),
        help="where runs and reference builds go: local device leases (default) or one Slurm "
             "job each (docs/slurm.md)")
    # K >= 3 (harness.runner.calibrate.check_repeats); None: no calibration (Settings: 0).
    calibrate_repeats: int | None = _option(
        "--harness-calibrate", None, metavar="K", type=int,
        help="measure this machine's noise: every reference key runs K times in all (K >= 3) "
             "and the worst scale-free errors of the repeats and of the passing cases go to "
             "<reference cache>/calibration/, whose thresholds later sessions use "
             "(docs/verdicts.md, Calibration)")
    baseline: str | None = _option(
        "--harness-baseline", None, metavar="pytorch|DIR",
        help="also check every case of a foreign trainer against an independent "
             "implementation: `pytorch` runs the bundled PyTorch trainer with the trainer's "
             "semantics (one device, cached like references); DIR reads recorded logs "
             "(PyTorch, Megatron, InfiniTrain run folders, harness sessions). Kept apart from "
             "the self-check in every record")
    reference_cache_max_gb: float = _option(
        "--harness-reference-cache-max-gb", 20.0, metavar="GB", type=float,
        help="bound on the reference cache; least recently used entries are evicted at "
             "session end (default 20; 0: no bound)")
    # A string as given (`--partition=x --qos=y`); Settings holds its words.
    slurm_args: str | tuple[str, ...] = _option(
        "--harness-slurm-args", (), metavar="ARGS", late=True,
        help="extra sbatch arguments for every job, e.g. '--partition=gpu --account=nightly' "
             "or one word, '--partition=gpu'")
    # pytest's own selection, recorded with the settings (`--compare` lists a change of them)
    workers: int | str | None = _selected("-n", "numprocesses")  # pytest-xdist
    marker: str | None = _selected("-m", "markexpr")
    keyword: str | None = _selected("-k", "keyword")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            option = f.metadata.get("option")
            if option is not None and option.choices and value is not None \
                    and value not in option.choices:
                raise ValueError(f"{option.flag} {value!r}: expected one of "
                                 f"{', '.join(option.choices)}")
            if option is not None and option.type is not None and value is not None \
                    and not isinstance(value, _ACCEPTED[option.type]):
                raise ValueError(f"{option.flag} {value!r}: expected "
                                 f"{_EXPECTED[option.type]}")

    @classmethod
    def from_pytest(cls, getoption: Callable[..., Any]) -> "Options":
        """The options as given (`getoption`: pytest's config.getoption): the one loop that
        reads them. pytest's -m / -k are "" when not given, -n is absent without xdist."""
        given = {}
        for f in fields(cls):
            if "option" in f.metadata:
                given[f.name] = getoption(f.metadata["option"].flag)
            else:
                value = getoption(f.metadata["selected"].dest, None)
                given[f.name] = None if value == "" else value
        if isinstance(given["variables"], list):  # argparse appends to a list
            given["variables"] = tuple(given["variables"])
        return cls(**given)

    def check(self) -> None:
        """ValueError naming the flag for options that cannot go together or are out of range
        (checked when the session starts, before anything runs)."""
        parse_case_patterns(self.cases)
        if self.calibrate_repeats is None:
            return
        # the calibration's arithmetic loads numpy: only for a calibration session
        from harness.compare.calibration import check_repeats

        check_repeats(self.calibrate_repeats)
        if self.golden_dir:
            raise ValueError("--harness-calibrate measures against references run on this "
                             "machine; it cannot be combined with --harness-golden")

    def overrides(self) -> Overrides:
        """What the command line says over the config file (ValueError naming a bad
        --harness-var): --infinitrain-build alone means the InfiniTrain backend."""
        build = self.infinitrain_build
        return Overrides(variables=Overrides.parse_variables(self.variables),
                         backend=self.trainer or ("infinitrain" if build else None),
                         build_dir=str(Path(build).resolve()) if build else None,
                         launch=self.infinitrain_launch,
                         flag_roles=tuple(self.flag_roles or ()))

    def config_path(self, named: list[Path], rootpath: Path) -> Path:
        """The session's test config: --harness-config, else the one JSON config named on the
        command line (`named`, named_configs), else configs/test_config.json under the rootdir;
        ValueError for more than one named."""
        if self.config:
            return Path(self.config).resolve()
        if len(named) > 1:
            raise ValueError("one harness config per session; got "
                             + ", ".join(str(p) for p in named)
                             + " (run them one after the other)")
        if named:
            return named[0]
        return (rootpath / "configs" / "test_config.json").resolve()

    def output_dir(self, rootpath: Path, env_output: Path | None, default: Path) -> Path:
        """--harness-output, else $HARNESS_OUTPUT (`env_output`), else `default` under the
        rootdir; absolute: trainers run in folders of their own, where a relative path means
        another place."""
        return Path(self.output or env_output or rootpath / default).resolve()

    def reference_root(self, output: Path) -> Path:
        """--harness-reference-cache, else <output>/reference-cache."""
        return Path(self.reference_cache).resolve() if self.reference_cache \
            else output / "reference-cache"


def paths_read_as_test_paths(args: list[str], invocation_dir: Path) -> list[tuple[str, str]]:
    """(flag, value) of each harness option written `--flag VALUE` (two words) whose VALUE is
    an existing path outside `invocation_dir`. pytest finds its rootdir and its config file
    before any plugin's options are known, from the command line's words that are existing
    paths: such a VALUE is one of them, so the rootdir becomes an ancestor of it and of the
    invocation folder, and the project's config file (its testpaths, the config's cases) is
    not found. The first night of `--harness-output /srv/nightly` (not there yet) runs; every
    night after it collects nothing. `--flag=VALUE` is one word, which pytest does not read
    as a path."""
    takes_value = {f.metadata["option"].flag for f in fields(Options)
                   if "option" in f.metadata and f.metadata["option"].action != "store_true"}
    found = []
    for flag, value in zip(args, args[1:]):
        if flag in takes_value and Path(invocation_dir, value).exists():
            path = Path(invocation_dir, value).resolve()
            if path != invocation_dir.resolve() and invocation_dir.resolve() not in path.parents:
                found.append((flag, value))
    return found


def rootdir_problem(args: list[str], invocation_dir: Path, rootpath: Path,
                    inipath: Path | None) -> str | None:
    """Why this session cannot run as asked when harness options pulled pytest's rootdir away
    from the project (paths_read_as_test_paths) and pytest found no config file there; None
    when they did not, when a config file was found all the same (-c, one above both), or
    when the command names its rootdir (--rootdir: pytest then takes it, whatever the paths)."""
    pulled = paths_read_as_test_paths(args, invocation_dir)
    if not pulled or inipath is not None or any(a == "--rootdir" or a.startswith("--rootdir=")
                                                for a in args):
        return None
    return ("; ".join(f"{flag} {value}" for flag, value in pulled) + ": pytest read "
            f"{'this path' if len(pulled) == 1 else 'these paths'} as a test path while "
            f"finding its rootdir (before the harness's options are known), took {rootpath} as "
            "the rootdir and found no config file there, so the project's testpaths and "
            "cases would not be collected. Write "
            + ", ".join(f"{flag}={value}" for flag, value in pulled)
            + f" (one word), or add --rootdir={invocation_dir}")


def named_configs(args: list[str]) -> list[Path]:
    """JSON files named as paths on the command line (pytest's args): harness configs, collected
    as cases (`pytest my_config.json`), wherever they are."""
    named = []
    for arg in args:
        path = Path(arg.split("::")[0])
        if path.suffix == ".json" and path.is_file() and path.resolve() not in named:
            named.append(path.resolve())
    return named


def option_fields() -> dict[str, Option]:
    """field name -> its option, for every declared option, in the table's order."""
    return {f.name: f.metadata["option"] for f in fields(Options) if "option" in f.metadata}


def flag_of(name: str) -> str:
    """The command-line flag of a settings name: `slots` -> --gpus, `workers` -> -n."""
    for f in fields(Options):
        if f.name == name:
            return (f.metadata.get("option") or f.metadata["selected"]).flag
    raise KeyError(f"{name!r} is no setting; expected one of "
                   f"{', '.join(f.name for f in fields(Options))}")


def join_option_value(args: list[str], option: str) -> list[str]:
    """args with every `option VALUE` pair as the one word `option=VALUE`."""
    joined, index = [], 0
    while index < len(args):
        if args[index] == option and index + 1 < len(args):
            joined.append(f"{option}={args[index + 1]}")
            index += 2
            continue
        if args[index] == "--":  # what follows is not options
            joined.extend(args[index:])
            break
        joined.append(args[index])
        index += 1
    return joined


def declarations(late: bool = False) -> list[tuple[str, dict]]:
    """(flag, pytest addoption keywords) of every option declared at pytest_addoption, or with
    `late` of those declared after pytest's first parse."""
    declared = []
    for f in fields(Options):
        option = f.metadata.get("option")
        if option is None or option.late != late:
            continue
        kwargs: dict[str, Any] = {"help": option.help}
        if option.action is not None:
            kwargs["action"] = option.action
        if option.action != "store_true":
            # argparse appends to its default: an append option's is a fresh list
            kwargs["default"] = list(f.default) if option.action == "append" else f.default
        for key in ("metavar", "type", "choices"):
            if getattr(option, key) is not None:
                kwargs[key] = getattr(option, key)
        declared.append((option.flag, kwargs))
    return declared


def _default(name: str) -> Any:
    """The option's default, for a Settings field of the same name: one default each."""
    default = Options.__dataclass_fields__[name].default
    assert default is not MISSING, name
    return default


@dataclass(frozen=True)
class Settings:
    session_id: str
    session_dir: Path
    reference_root: Path
    lease_dir: Path
    slots: int | None = _default("slots")  # devices the run may use (derived when None)
    device: str = _default("device")  # cpu | cuda (auto: resolved by derive)
    timeout_s: float = _default("timeout_s")
    worker: str = "main"
    # the bundled trainer's: torchrun | zygote (harness.launch.zygote); `auto` is resolved by
    # derive, and launches as torchrun where a Settings is built directly (tests)
    launcher: str = _default("launcher")
    # gradient dumps kept after the diff: failed | all | none
    keep_dumps: str = _default("keep_dumps")
    # module-level traces taken (harness.runner.trace): failed | all | none
    trace: str = _default("trace")
    # compare against golden records here (harness.reference.golden)
    golden_dir: Path | None = _default("golden_dir")
    # record the references used as golden records here
    golden_write_dir: Path | None = _default("golden_write_dir")
    # use a golden from another environment (recorded)
    golden_allow_mismatch: bool = _default("golden_allow_mismatch")
    # Placement (harness.launch.multinode, harness.launch.slurm): the most nodes a case may
    # span, processes per node (None: the slots over the nodes), where runs go (local | slurm)
    # and the Slurm job's extra sbatch arguments.
    nnodes: int = _default("nnodes")
    nproc_per_node: int | None = _default("nproc_per_node")
    scheduler: str = _default("scheduler")
    slurm_args: tuple[str, ...] = _default("slurm_args")
    # --harness-calibrate K: each reference key is run K - 1 more times and this machine's
    # noise written beside the reference cache (harness.runner.calibrate); 0 (derive's for
    # None): no calibration.
    calibrate_repeats: int | None = _default("calibrate_repeats")
    # --harness-baseline: `pytorch` (the bundled trainer with the subject's semantics, live,
    # harness.baseline.live) or a folder of recorded logs (harness.logs); None: no baseline
    # check, which the summary says.
    baseline: str | None = _default("baseline")

    def __post_init__(self) -> None:
        table = option_fields()
        for name in ("device", "launcher", "keep_dumps", "trace", "scheduler"):  # the options' choices
            value, allowed = getattr(self, name), table[name].choices
            if name == "launcher":  # those registered now: a launcher may be added at run time
                allowed = ("auto", *launcher_names())
            if value not in allowed:
                raise ValueError(f"{table[name].flag} {value!r}: expected one of "
                                 f"{', '.join(allowed)}")

    @classmethod
    def from_options(cls, options: Options, session_dir: Path, reference_root: Path,
                     worker: str = "main") -> "Settings":
        """A session's settings from its options: the fields Settings shares with Options."""
        shared = {f.name for f in fields(cls)} & set(option_fields())
        return cls.derive(session_dir, reference_root, worker,
                          **{k: v for k, v in vars(options).items() if k in shared})

    @classmethod
    def derive(cls, session_dir: Path, reference_root: Path, worker: str = "main",
               **given) -> "Settings":
        """Settings from option values as given (None: the option's default), with what is
        derived from them resolved."""
        defaults = {f.name: f.default for f in fields(cls) if f.name in option_fields()}
        unknown = set(given) - set(defaults)
        if unknown:
            raise TypeError(f"Settings.derive: unknown setting(s) {sorted(unknown)}; "
                            f"expected some of {sorted(defaults)}")
        values = {**defaults, **{k: v for k, v in given.items() if v is not None}}
        device = resolve_device(values["device"])
        launcher = values["launcher"]
        if launcher == "auto":  # the zygote where it is measured and safe: CPU (docs/benchmarks.md)
            launcher = "zygote" if device == "cpu" else "torchrun"
        slots = values["slots"]
        if slots is None:
            slots = cuda_count() if device == "cuda" else (os.cpu_count() or 1)
        slurm_args = values["slurm_args"]
        if isinstance(slurm_args, str):
            slurm_args = shlex.split(slurm_args)
        # Leases are machine-wide for real GPUs, per session for virtual CPU slots.
        lease_dir = (Path("/tmp") / f"harness-device-leases-{os.getuid()}" if device == "cuda"
                     else session_dir / "leases")
        paths = {k: Path(values[k]).resolve() if values[k] else None
                 for k in ("golden_dir", "golden_write_dir")}
        return cls(session_id=session_dir.name, session_dir=session_dir,
                   reference_root=reference_root, lease_dir=lease_dir, worker=worker,
                   **{**values, **paths, "device": device, "launcher": launcher, "slots": slots,
                      "slurm_args": tuple(slurm_args), "nnodes": max(1, values["nnodes"] or 1),
                      "calibrate_repeats": values["calibrate_repeats"] or 0})

    def record(self, options: Options) -> dict:
        """The session header's `settings` block: every option by its field name, the runner's
        as resolved here (device, launcher, slots), the session's as given (None: not given),
        and pytest's -n / -m / -k (workers, marker, keyword); JSON values only."""
        resolved = {f.name: getattr(self, f.name) for f in fields(self)
                    if f.name in option_fields()}
        block = {}
        for name, value in {**vars(options), **resolved}.items():
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            block[name] = value
        return block


@dataclass
class Outcome:
    status: str  # passed | failed | skipped | error
    message: str  # the failure / skip text shown by pytest
    record: dict = field(default_factory=dict)


def resolve_device(device: str) -> str:
    """--harness-device: `auto` is CUDA where a device is present, else CPU."""
    if device == "auto":
        return "cuda" if cuda_count() else "cpu"
    return device


# Device nodes a GPU driver creates (NVIDIA; AMD's ROCm, whose torch also answers torch.cuda;
# WSL's GPU bridge). Without any of them no torch build can see a device.
_GPU_DEVICE_NODES = ("/dev/nvidia*", "/dev/kfd", "/dev/dxg")


def gpu_device_nodes_present() -> bool:
    return any(glob.glob(pattern) for pattern in _GPU_DEVICE_NODES)


def cuda_count() -> int:
    # Importing torch takes the controller (and every xdist worker) 1-1.5 s, ~5% of a small
    # session on CPU (benchmarks/harness_overhead.py): skip it where no GPU driver is present.
    if not gpu_device_nodes_present():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
