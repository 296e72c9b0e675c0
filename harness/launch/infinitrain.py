"""InfiniTrain's own GPT-2 / LLaMA 3 binaries as the trainer under test.

What this backend knows about them (see docs/infinitrain.md, checked in InfiniTrain's source):

- A build folder holds `gpt2`, `llama3` and `infini_run` (or `tools/infini_run/infini_run`).
  Every run gets its own working folder: the binaries exchange NCCL ids through
  `cclUniqueId_*.bin` files in the current folder, so two runs in one folder collide.
- Two launch modes: `threads` (InfiniTrain's scripts: one process, `--nthread_per_process N`)
  and `infini_run` (`infini_run --nproc_per_node N -- ./gpt2 ...`, one process per device).
  A case whose group has `infini_run_args` (the newer runner's per-group launch) runs through
  infini_run with that many processes whatever the mode, its nthread_per_process as it says.
  The `--` stays: the runner writes `./infini_run --nproc_per_node=N ./gpt2 --input_bin ...`
  without it, but infini_run's gflags permutes argv and reads every later flag as its own.
- On an accelerator `--device` is the config's DEVICE_BACKEND (default cuda), as InfiniTrain's
  fix_muxi_device_registry runner passes it.
- Flags are gflags, strict: the command carries the case's flags exactly as the config says,
  plus the model's files and the device; nothing the harness invented.
- The step line goes through glog: to stderr (prefixed `E20260625 05:21:33.123456 12345
  main.cc:NNN] `) and to glog's log files, which the harness points at the run's log folder
  (GLOG_log_dir). A fatal line (`F...`) is a crash; so is exit 0 with steps missing, since
  infini_run exits 0 whatever its children do.
- What a binary can do is learned from the binary before anything launches (its `--helpxml`
  flag listing and whether it is a CUDA build; harness.launch.binary_facts), once per name and
  what runs (a wrapper script followed to what it execs), kept beside the reference cache:
  every session and worker decides the same way.
  `--dump_gradients` exists only where InfiniTrain's #209 added it (GPT-2); a binary without
  it is compared on loss only, said so. A case flag the binary does not list, or a multi-rank
  case on a build without CUDA, is skipped with that reason.
- TP ranks write their shards un-gathered under the full name: replicated parameters are
  compared whole, sharded ones against the TP slice of the reference they hold
  (harness.compare.tp_shards). A resumed run dumps nothing (#209 dumps on the loop's step
  index 0 only): compared on loss only, with that reason.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from harness.contracts.flags import FLAG_TABLE, flag_argv, resumed_first_step
from harness.contracts.programs import PROGRAMS
from harness.contracts.semantics import baseline_flags
from harness.contracts.trace import PAIRINGS, PRECISION_CHECK_FLAG, Pairing

from .backends import (
    LaunchSpec,
    RunOutputs,
    base_environment,
    logged_text,
    parse_step_lines,
    run_command,
)
from .binary_facts import BinaryFacts, BinaryFactsError, Identity, identify, learn_binary
from .process import ProcessResult

LAUNCH_MODES = ("threads", "infini_run")
_LAUNCHER_PATHS = ("infini_run", "tools/infini_run/infini_run")
# The binaries a build folder may hold: every program InfiniTrain builds, as facts
# (harness/contracts/data/infinitrain_programs.json).
_BINARIES = tuple(program.binary for program in PROGRAMS.values())
_LIBRARY = re.compile(r"\.so(\.\d+)*$|\.a$")
# glog's line prefix: severity, date, time, thread id, file:line]
_GLOG_PREFIX = re.compile(r"^[IWEF](?:\d{4})?\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]*\] ", re.M)
_FATAL = re.compile(r"^F(?:\d{4})?\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<where>[^\]]*)\] "
                    r"(?P<message>.*)$", re.M)
# The loaders' checks of a model file (example/*/config.h, checkpoint_loader.cc)
_LOADER_SOURCES = ("config.h", "checkpoint_loader")
_UNKNOWN_FLAG = re.compile(r"unknown command line flag '(?P<flag>[^']+)'")
_RANK = re.compile(r"\b[Rr]ank[ _:]*(\d+)")
# Defaults of the two flags that decide which steps a run prints (InfiniTrain's main.cc).
DEFAULT_NUM_ITERATION = 10


class InfiniTrainError(ValueError):
    """A build folder or launch setting that cannot work; the message names it."""


class InfiniTrainBackend:
    name = "infinitrain"

    def __init__(self, build_dir: str | Path, launch: str = "threads",
                 env: dict[str, str] | None = None, facts_dir: Path | None = None,
                 source: str = "--infinitrain-build", device_backend: str = "cuda") -> None:
        self.build_dir = Path(build_dir).resolve()
        if not self.build_dir.is_dir():
            hint = ("; the config has InfiniTrain's shape, so its cases run InfiniTrain's "
                    "binaries: pass --infinitrain-build DIR, or --harness-trainer harness for "
                    "the bundled trainer") if source == "variable BUILD_DIR" else ""
            raise InfiniTrainError(f"{source} {build_dir}: not a folder; expected "
                                   f"InfiniTrain's build folder (holding gpt2 and "
                                   f"llama3){hint}")
        if launch not in LAUNCH_MODES:
            raise InfiniTrainError(f"--infinitrain-launch {launch!r}: expected one of "
                                   f"{', '.join(LAUNCH_MODES)}")
        self.launch_mode = launch
        # the `--device` word on an accelerator (the config's DEVICE_BACKEND)
        self.device_backend = device_backend
        self.env = dict(env or {})
        self._version: str | None = None
        self._identity: dict[str, Identity] | None = None
        # Where each binary's facts are kept (beside the reference cache); None: asked per
        # process (tests that build no cache).
        self.facts_dir = Path(facts_dir) if facts_dir is not None else None
        self._facts: dict[str, BinaryFacts] = {}

    @classmethod
    def from_config(cls, config, facts_dir: Path | None = None) -> "InfiniTrainBackend":
        """The backend a config's trainer section names (harness.registry's factory)."""
        spec = config.trainer
        return cls(spec.build_dir, spec.launch, env=dict(spec.env), facts_dir=facts_dir,
                   source=spec.build_source, device_backend=spec.device_backend)

    # ------------------------------------------------------------------ the build

    def binary(self, model: str) -> Path:
        if model not in PROGRAMS:
            raise InfiniTrainError(f"InfiniTrain program {model!r}: the harness has no facts "
                                   f"for it (known: {', '.join(PROGRAMS)}); it is never run as "
                                   f"another program")
        program = PROGRAMS[model]
        path = self.build_dir / program.binary
        if not path.is_file():
            raise InfiniTrainError(f"{self.build_dir}: no `{program.binary}` binary in "
                                   f"InfiniTrain's build folder (build it, or leave {model} "
                                   f"out: variable {program.groups_variable} names its tags, "
                                   f"a config's `models` its models)")
        return path

    def facts(self, model: str) -> BinaryFacts:
        """What the model's binary can do (its flag listing, CUDA or not), learned from the
        binary once per name and what it runs (a wrapper followed to what it execs)."""
        if model not in self._facts:
            binary = self.binary(model)
            store = self.facts_dir or (self.build_dir / ".harness-binary-facts")
            try:
                self._facts[model] = learn_binary(binary, store)
            except BinaryFactsError as error:
                raise InfiniTrainError(str(error)) from None
        return self._facts[model]

    def launcher(self) -> Path:
        for relative in _LAUNCHER_PATHS:
            if (self.build_dir / relative).is_file():
                return self.build_dir / relative
        raise InfiniTrainError(f"{self.build_dir}: no infini_run launcher (looked for "
                               f"{', '.join(_LAUNCHER_PATHS)}); build it or use "
                               f"--infinitrain-launch threads")

    def _identities(self) -> dict[str, Identity]:
        """What each model's binary runs (binary_facts.identify: a wrapper script followed to
        what it execs), once per backend."""
        if self._identity is None:
            paths = {name: self.build_dir / program.binary for name, program in PROGRAMS.items()}
            self._identity = {name: identify(path) for name, path in paths.items()
                              if path.is_file()}
        return self._identity

    def identities(self) -> dict[str, str]:
        """model -> how its binary was identified (`elf`, `script -> /path`, ...)."""
        return {model: identity.identified for model, identity in self._identities().items()}

    def version(self) -> str:
        """A content hash of the binaries, of what a wrapper script among them execs, and of
        the build's libraries: a rebuild, behind a wrapper too, is a new reference."""
        if self._version is None:
            digest = hashlib.sha256()
            files = [self.build_dir / n for n in (*_BINARIES, *_LAUNCHER_PATHS)]
            files += sorted(p for p in self.build_dir.rglob("*")
                            if p.is_file() and _LIBRARY.search(p.name))
            for path in files:
                if path.is_file():
                    digest.update(str(path.relative_to(self.build_dir)).encode() + b"\0")
                    with open(path, "rb") as stream:
                        for block in iter(lambda: stream.read(1 << 20), b""):
                            digest.update(block)
            for model, identity in sorted(self._identities().items()):  # what a wrapper execs
                digest.update(f"{model}\0{identity.sha256}\0{identity.identified}\0".encode())
            self._version = f"infinitrain-{digest.hexdigest()[:16]}"
        return self._version

    # ------------------------------------------------------------------ what is compared

    def unsupported(self, model: str, args: dict, world_size: int) -> str | None:
        """Why this build cannot run these flags at all, from the binary's own facts, or None:
        a known flag its listing lacks (an older build, master without #209's flags), or
        several ranks on a build without CUDA. A flag neither the binary nor the flag table
        knows is no build's feature but a mistake in the config: an error, not a quiet skip."""
        facts = self.facts(model)
        unknown = sorted(name for name in args if not facts.accepts(name))
        mistakes = [name for name in unknown if name not in FLAG_TABLE]
        if mistakes:
            raise InfiniTrainError(
                f"the {model} binary ({self.binary(model)}) does not accept "
                f"{', '.join('--' + n for n in mistakes)}: not in its --helpxml flag listing, "
                f"nor a flag the harness knows (a misspelt flag?)")
        if unknown:
            return (f"this build's {model} binary does not accept "
                    f"{', '.join('--' + n for n in unknown)} (not in its --helpxml flag "
                    f"listing; {self.binary(model)})")
        if not self.expected_steps(args):
            return (f"prints no step line to compare (--log_interval="
                    f"{args.get('log_interval')}: {FLAG_TABLE['log_interval'].source})")
        if world_size > 1 and not PROGRAMS[model].multi_device:
            return (f"needs {world_size} ranks, but InfiniTrain's {model} runs on one device "
                    f"only ({PROGRAMS[model].source('multi_device')})")
        if world_size > 1 and not facts.multi_rank:
            return (f"needs {world_size} ranks, but this build of {model} has no CUDA (its "
                    f"binary links no libcudart / libnccl), and InfiniTrain runs parallel "
                    f"ranks on CUDA only ({self.binary(model)})")
        return None

    def gradients_unavailable(self, model: str, args: dict) -> str | None:
        """Why a run of these flags cannot give comparable gradients, or None."""
        if not self.facts(model).accepts("dump_gradients"):
            return (f"not dumped by this trainer (its {model} binary lists no "
                    f"--dump_gradients flag)")
        if args.get("load"):
            return ("not compared for a resumed run: InfiniTrain dumps gradients only on the "
                    "first step of a run from scratch (the loop's step index 0)")
        return None

    def gradient_shards(self, args: dict) -> int:
        """The TP degree the dump's sharded files are cut by (each TP rank writes its own
        shard, un-gathered, under the full name)."""
        return max(1, int(args.get("tensor_parallel", 1)))

    def first_step(self, args: dict) -> int:
        """The first step a run prints: 1, or the resumed checkpoint's step + 1."""
        return resumed_first_step(args.get("load"))

    def trace_unavailable(self, model: str, args: dict) -> str | None:
        """Why a run of these flags cannot be traced module by module, or None: a binary whose
        --helpxml listing has no --precision_check (InfiniTrain master has it), a program
        without pairing facts, a resumed run (its first step is not the traced one)."""
        if not self.facts(model).accepts(PRECISION_CHECK_FLAG):
            return (f"not traced: this build's {model} binary lists no --{PRECISION_CHECK_FLAG} "
                    f"flag")
        if model not in PAIRINGS:
            return (f"not traced: no module pairing facts for {model} "
                    f"(harness/contracts/data/trace_pairing.json)")
        if args.get("load"):
            return "not traced: a resumed run's steps depend on the checkpoint it loads"
        return None

    def trace_pairing(self, model: str) -> Pairing | None:
        return PAIRINGS.get(model)

    def baseline_flags(self, model: str, args: dict) -> dict:
        """The PyTorch baseline's flags: InfiniTrain's semantics (harness.contracts.semantics),
        with the defaults this build's own --helpxml listing gives."""
        return baseline_flags(model, args, self.facts(model).default)

    def expected_steps(self, args: dict) -> list[int]:
        """The steps a run prints: every one, or with tiny_mixtral's `--log_interval N` every
        N-th and the last (feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:140; 0: none)."""
        last = int(args.get("num_iteration", DEFAULT_NUM_ITERATION))
        every = int(args.get("log_interval", 1))
        return [s for s in range(self.first_step(args), last + 1)
                if every > 0 and (s % every == 0 or s == last)]

    # ------------------------------------------------------------------ the run

    def working_dir(self, spec: LaunchSpec) -> Path:
        folder = spec.output_dir / "work"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def command(self, spec: LaunchSpec) -> list[str]:
        args = dict(spec.flags)
        device = spec.device if spec.device == "cpu" else self.device_backend
        common = [f"--input_bin={spec.input_bin}", f"--llmc_filepath={spec.checkpoint}",
                  f"--device={device}"]
        if spec.gradients_dir is not None and self.facts(spec.model).accepts("dump_gradients"):
            common.append(f"--dump_gradients={spec.gradients_dir}")
        binary = str(self.binary(spec.model))
        processes = self._processes(spec)
        if not processes:
            if spec.world_size > 1:
                # The launch mode owns the device count; a case that gives it says the same.
                args["nthread_per_process"] = spec.world_size
            return [binary, *common, *flag_argv(args)]
        if not spec.launcher_processes:  # the launch mode's: one device per process
            args.pop("nthread_per_process", None)
        return [str(self.launcher()), f"--nproc_per_node={processes}",
                f"--rdzv_endpoint=127.0.0.1:{spec.port or 29500}", "--",
                binary, *common, *flag_argv(args)]

    def _processes(self, spec: LaunchSpec) -> int:
        """How many processes infini_run starts for this run; 0: the binary alone. A group's
        own launch (infini_run_args) whatever the mode; else the infini_run mode's one per
        rank over more than one rank."""
        if spec.launcher_processes:
            return spec.launcher_processes
        return spec.world_size if self.launch_mode == "infini_run" and spec.world_size > 1 else 0

    def launch(self, spec: LaunchSpec, settings) -> ProcessResult:
        return run_command(self, spec, settings)

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        env = base_environment(spec, self.env)
        glog = spec.log_dir / "glog"
        glog.mkdir(parents=True, exist_ok=True)
        env["GLOG_log_dir"] = str(glog)
        env.pop("GLOG_logtostderr", None)  # keep the files: they are the rank logs
        env.pop("GLOG_logtostdout", None)
        # glog buffers INFO lines in its files: after a signal they would end at start-up.
        # Unbuffered, the log tail holds the binary's last line (e.g. `Rank 0: start forward`).
        env["GLOG_logbuflevel"] = "-1"
        return env

    def collect(self, spec: LaunchSpec, result: ProcessResult) -> RunOutputs:
        text = self._text(spec, result)
        steps = parse_step_lines(text)
        # The working folder is scratch: what a binary leaves there unasked goes with it.
        # feat/lr_scheduler's binaries save `./checkpoints/checkpoint_final` at the end of every
        # run (@a7949ac:example/gpt2/main.cc:93 `--save` defaults to ./checkpoints, :536-540),
        # which a reference cache would keep for every reference (a session of that branch's
        # config: 494 MB). Checkpoints a case asks for are under the session (reroot_checkpoints),
        # logs, dumps and gradients in the run's own folders.
        shutil.rmtree(self.working_dir(spec), ignore_errors=True)
        return RunOutputs(steps=steps, gradients_dir=spec.gradients_dir, run_record=None,
                          problem=self._problem(spec, result, text, steps))

    def _text(self, spec: LaunchSpec, result: ProcessResult) -> str:
        return logged_text(result, self._glog_files(spec))

    def _problem(self, spec: LaunchSpec, result: ProcessResult, text: str,
                 steps: list[dict]) -> str | None:
        unknown = _UNKNOWN_FLAG.search(text)
        if unknown:
            return (f"the {spec.model} binary ({self.build_dir / spec.model}) rejects the flag "
                    f"--{unknown['flag']}: {unknown.group(0)}")
        fatal = _FATAL.search(text)
        if fatal:
            message = fatal["message"].strip()
            hint = self._asset_hint(spec) if fatal["where"].startswith(_LOADER_SOURCES) else ""
            return f"a rank stopped on a fatal error: {message}{hint}"
        if result.timed_out:
            return None  # said by the runner, with the timeout
        expected = self.expected_steps(spec.flags)
        printed = {int(s["step"]) for s in steps}
        missing = [s for s in expected if s not in printed]
        if not missing:
            return None
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        lines = f"{len(missing)} of {len(expected)} step lines missing (step {shown})"
        if self._processes(spec):
            if result.returncode == 0:
                return (f"{lines}: a rank crashed or stopped early (infini_run exits 0 "
                        f"whatever its children do)")
            return f"{lines}: a rank crashed or stopped early"
        if result.returncode == 0:
            return f"the {spec.model} binary exited 0 with {lines}"
        return f"the {spec.model} binary stopped early: {lines}"

    def _asset_hint(self, spec: LaunchSpec) -> str:
        """For a loader check that refused the model file: the file, and what would load."""
        return (f" (the model file {spec.checkpoint} is refused by {spec.model}'s loader; "
                f"the synthetic preset `infinitrain` of harness.assets loads in InfiniTrain "
                f"master: `python -m harness.assets --preset infinitrain --out DIR` writes its "
                f"files, and a config without model files uses it)")

    def _glog_files(self, spec: LaunchSpec) -> list[Path]:
        folder = spec.log_dir / "glog"
        # glog writes <program>.<host>.<user>.log.<SEVERITY>.<time>.<pid>, and a symlink per
        # severity; the INFO file holds every line.
        return sorted(p for p in folder.glob("*.log.INFO.*") if p.is_file() and not p.is_symlink())

    def rank_logs(self, spec: LaunchSpec, result: ProcessResult) -> dict[str, list[Path]]:
        """glog's files, one per process (named by pid: InfiniTrain's lines carry no rank)."""
        logs: dict[str, list[Path]] = {}
        for path in self._glog_files(spec):
            logs.setdefault(f"pid {path.name.rsplit('.', 1)[-1]}", []).append(path)
        if not logs:
            logs["launcher"] = [p for p in (result.stdout, result.stderr) if p.is_file()]
        return logs

    def failing_rank(self, spec: LaunchSpec, result: ProcessResult) -> str | None:
        fatal = _FATAL.search(self._text(spec, result))
        rank = _RANK.search(fatal["message"]) if fatal else None
        return rank.group(1) if rank else None


def strip_glog_prefix(text: str) -> str:
    """The message of each glog line, its prefix removed."""
    return _GLOG_PREFIX.sub("", text)
