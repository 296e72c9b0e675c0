"""The flag table: every trainer flag the harness knows, in one declarative list.

Each flag says its type, the bundled trainer's default and help, which trainers have it, who
sets it, and its *role*, which is what the reference rule reads:

- ``mathematics``: changes what is computed (dtype, batch sizes, learning rate, LoRA, ...).
  A case's reference keeps it.
- ``topology``: only changes how the work is placed (pipeline / virtual pipeline / tensor /
  sequence / data parallelism, thread or process count, layout flags, schedule, ZeRO). The
  reference drops it: the reference of a case is the same case on one device.
- ``output``: where a run writes things, or extra work that does not change the numbers
  (checkpoint saving, text generation, profiling). The reference drops it.
- ``resume``: a run that starts from a saved checkpoint; the reference drops it (it runs from
  the start) and the resumed run's steps are compared to the reference's same steps.
- ``memory``: trades memory for compute without changing what is computed (activation
  recompute). The reference drops it, so a recompute case is compared with the same run
  without recompute: what such a flag must prove.
- ``input``: the model, its files and the device; the harness sets them for every run.

A flag of a foreign trainer's own carries ``source``: where that trainer defines it
(``BRANCH@COMMIT:path:line`` in InfiniTrain). A flag that is not in this table is passed
through verbatim, treated as mathematics (kept in the reference, since dropping a flag that
changes the numbers would give a wrong reference), listed in the case's record and named in
the session summary; a user declares its role with ``--harness-flag-role NAME=ROLE`` or the
config's ``flag_roles`` (``DeclaredRoles``), without a change here.

No torch here: the pytest plugin, the config loader and the trainer all import this module.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

HARNESS = "harness"  # the bundled trainer (python -m harness.trainer)
INFINITRAIN = "infinitrain"  # InfiniTrain's gpt2 / llama3 binaries
BOTH = frozenset({HARNESS, INFINITRAIN})

ROLES = ("mathematics", "topology", "output", "resume", "memory", "input")
# Roles a case's reference run drops.
DROPPED_BY_REFERENCE = frozenset({"topology", "output", "resume", "memory"})
# What a flag the table does not know is taken for: kept in the reference.
ASSUMED_ROLE = "mathematics"
# Roles a user may declare for a flag the table does not know (`input` flags are the harness's).
DECLARABLE_ROLES = tuple(r for r in ROLES if r != "input")

DTYPES = ("float32", "bfloat16")  # what a case may ask for (each has its verdict's thresholds)
# The bundled trainer also runs float64 on one device: the oracle a calibration session runs
# once per reference key (harness.runner.calibrate, "fp64_ratio"); no case config offers it.
ORACLE_DTYPE = "float64"
TRAINER_DTYPES = (*DTYPES, ORACLE_DTYPE)
OPTIMIZERS = ("sgd", "adamw")
DEVICES = ("cpu", "cuda")
# The schedule names torch.distributed.pipelining knows (get_schedule_class spells them so).
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV")
# torch.manual_seed takes any integer in this range (a larger one overflows inside torch).
SEED_RANGE = (-(2**63), 2**64 - 1)


class FlagError(ValueError):
    """A flag value a trainer cannot run with; the message names the flag."""


@dataclass(frozen=True)
class Flag:
    name: str
    type: type  # int, float, bool or str
    default: Any
    help: str
    role: str
    trainers: frozenset = BOTH
    owner: str = "case"  # "case": a case may set it; "harness": the harness sets it per run
    choices: tuple = ()
    minimum: float | None = None  # inclusive lower bound for numbers
    value_range: tuple | None = None  # inclusive (low, high) for integers
    # A checkpoint folder: the harness re-roots a case's value under the session, so that two
    # cases (or two sessions) never save into, or resume from, each other's folders.
    checkpoint_path: bool = False
    # Where a foreign trainer defines it (BRANCH@COMMIT:path:line); "" for the harness's own.
    source: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"flag {self.name}: role {self.role!r}; expected one of {ROLES}")
        if self.owner not in ("case", "harness"):
            raise ValueError(f"flag {self.name}: owner {self.owner!r}; expected case or harness")

    def check(self, value: Any) -> Any:
        """The typed value, or FlagError naming the flag, the value and what was expected.
        Strings are parsed as a command line would (so @VAR@ substitutions work)."""
        return check_value(self, value)


def _f(name, type_, default, help_, role, **more) -> Flag:
    return Flag(name, type_, default, help_, role, **more)


_POS = {"minimum": 1}
_NONNEG = {"minimum": 0}

FLAGS: tuple[Flag, ...] = (
    # The model and its files: the harness sets them for every run.
    _f("model", str, None, "a model family: gpt2, llama3 or mixtral (default: what the "
       "checkpoint holds; must agree with it)", "input", owner="harness"),
    _f("llmc_filepath", str, None, "llm.c checkpoint to start from", "input", owner="harness",
       source="master@b24d92f:example/gpt2/main.cc:52, example/llama3/main.cc:51"),
    _f("input_bin", str, None, "llm.c token file to train on", "input", owner="harness",
       source="master@b24d92f:example/gpt2/main.cc:47, example/llama3/main.cc:46"),
    _f("device", str, "cpu", "cpu (gloo) or cuda (nccl)", "input", owner="harness",
       choices=DEVICES,
       source="master@b24d92f:example/gpt2/main.cc:71, example/llama3/main.cc:70"),
    # Mathematics.
    _f("dtype", str, "float32", "compute dtype; parameters and gradients stay float32",
       "mathematics", choices=DTYPES,
       source="master@b24d92f:example/gpt2/main.cc:83, example/llama3/main.cc:81"),
    _f("batch_size", int, 4, "sequences per microbatch on each data-parallel rank",
       "mathematics", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:55, example/llama3/main.cc:54"),
    _f("sequence_length", int, 64, "tokens per sequence", "mathematics", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:56, example/llama3/main.cc:55"),
    _f("total_batch_size", int, None, "tokens per optimizer step over all ranks (default: one "
       "microbatch)", "mathematics", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:57, example/llama3/main.cc:56"),
    _f("num_iteration", int, 10, "optimizer steps", "mathematics", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:59, example/llama3/main.cc:58"),
    _f("learning_rate", float, 1e-4, "constant learning rate", "mathematics", **_NONNEG,
       source="master@b24d92f:example/gpt2/main.cc:63, example/llama3/main.cc:62"),
    _f("weight_decay", float, 0.0, "AdamW weight decay", "mathematics", trainers={HARNESS},
       **_NONNEG),
    _f("optimizer", str, "sgd", "sgd (plain, as InfiniTrain) or adamw", "mathematics",
       trainers={HARNESS}, choices=OPTIMIZERS),
    # llm.c's 0.95 by default; 0.999 for InfiniTrain's Adam (its optimizer.h), which the
    # PyTorch baseline of its llama3 runs with (harness.contracts.semantics).
    _f("adam_beta2", float, 0.95, "AdamW's second-moment decay (beta2)", "mathematics",
       trainers={HARNESS}, **_NONNEG),
    _f("seed", int, 42, "seed of every random choice the run makes", "mathematics",
       trainers={HARNESS}, value_range=SEED_RANGE),
    _f("lora_rank", int, 0, "LoRA rank (0: off)", "mathematics", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:95, example/llama3/main.cc:93"),
    _f("lora_alpha", float, 16.0, "LoRA alpha", "mathematics", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:96, example/llama3/main.cc:94"),
    _f("lora_target_modules", str, None, "LoRA target modules (comma list)", "mathematics",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:97, example/llama3/main.cc:95"),
    _f("lora_load_path", str, None, "LoRA weights to start from", "mathematics",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:100, example/llama3/main.cc:97"),
    _f("overfit_single_batch", bool, True, "train on one batch", "mathematics",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:69, example/llama3/main.cc:68"),
    # Topology: the reference drops these.
    _f("tensor_parallel", int, 1, "tensor-parallel degree", "topology", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:77, example/llama3/main.cc:76"),
    _f("sequence_parallel", bool, False, "shard norms and dropout-free activations over the "
       "TP group", "topology",
       source="master@b24d92f:example/gpt2/main.cc:78, example/llama3/main.cc:77"),
    _f("pipeline_parallel", int, 1, "pipeline stages", "topology", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:79, example/llama3/main.cc:78"),
    _f("virtual_pipeline_parallel", int, 1, "chunks per pipeline stage (uniform layout)",
       "topology", **_POS,
       source="master@b24d92f:example/gpt2/main.cc:80, example/llama3/main.cc:79"),
    _f("pipeline_layer_partition", str, None, "layers per stage, e.g. 4,8,6,6", "topology",
       source="InfiniTensor/InfiniTrain#209@7a78e15:example/*/main.cc (not in the fetched mirror: ../shared/INFINITRAIN.md)"),
    _f("pipeline_layer_costs", str, None, "per-layer costs to balance, e.g. 1x8,L:4.5",
       "topology",
       source="InfiniTensor/InfiniTrain#209@7a78e15:example/*/main.cc (not in the fetched mirror: ../shared/INFINITRAIN.md)"),
    _f("pipeline_chunk_layout", str, None, "ordered STAGE:LAYERS chunk list, e.g. "
       "0:3,1:3,1:3,0:3", "topology",
       source="InfiniTensor/InfiniTrain#209@7a78e15:example/*/main.cc (not in the fetched mirror: ../shared/INFINITRAIN.md)"),
    _f("pipeline_model_parallel_layout", str, None, "Megatron-style layout, e.g. "
       "'Et*3|t*3|t*3|t*3NL'", "topology",
       source="InfiniTensor/InfiniTrain#209@7a78e15:example/*/main.cc (not in the fetched mirror: ../shared/INFINITRAIN.md)"),
    _f("pipeline_schedule", str, None, "pipeline schedule (default: the one that fits the "
       "layout)", "topology", trainers={HARNESS}, choices=SCHEDULES),
    # Ours: the data-parallel degree (world size = data_parallel * tp * pp); InfiniTrain's:
    # the device (thread) count, world size, dp = it / (tp * pp). Neither is a trainer flag
    # of ours: the harness launches that many processes.
    _f("data_parallel", int, None, "data-parallel degree (the harness launches dp*tp*pp "
       "processes)", "topology", trainers=frozenset(), **_POS),
    _f("nthread_per_process", int, 1, "devices (InfiniTrain: threads of one process)",
       "topology", trainers={INFINITRAIN}, **_POS,
       source="master@b24d92f:example/gpt2/main.cc:73, example/llama3/main.cc:72"),
    _f("zero_stage", int, 0, "ZeRO stage (distributed optimizer)", "topology",
       trainers={INFINITRAIN}, value_range=(0, 3),
       source="master@b24d92f:example/gpt2/main.cc:64, example/llama3/main.cc:63"),
    _f("use_distributed_optimizer", bool, False, "shard the optimizer over DP", "topology",
       trainers={INFINITRAIN},
       source="feat/add_Qwen3-8B@a3f84f8:example/gpt2/main.cc:60, example/llama3/main.cc:59 (not on master, feat/lr_scheduler or feat/activation_checkpointing)"),
    # Output and extra work: the reference drops these.
    _f("dump_gradients", str, None, "write every parameter's gradient after the first step "
       "to this folder", "output", owner="harness",
       source="InfiniTensor/InfiniTrain#209@7a78e15:example/gpt2/main.cc (gpt2 only; not in the fetched mirror: ../shared/INFINITRAIN.md)"),
    _f("dump_parameter_updates", str, None, "write every parameter's change over the run "
       "(after the last step minus before the first) to this folder", "output",
       trainers={HARNESS}, owner="harness"),
    _f("output_dir", str, None, "where the step records, run record and layout are written",
       "output", trainers={HARNESS}, owner="harness"),
    _f("profile_layers", str, None, "write per-layer forward/backward timings (JSON lines) "
       "to this file; with more than one process each rank writes its own, FILE with "
       ".rank<r> before the suffix (layers.rank0.jsonl, layers.rank1.jsonl, ...), and "
       "`harness.layout.suggest --profile FILE` reads them all", "output", trainers={HARNESS},
       owner="harness"),
    _f("save", str, None, "checkpoint root folder", "output", trainers={INFINITRAIN},
       checkpoint_path=True,
       source="master@b24d92f:example/gpt2/main.cc:86, example/llama3/main.cc:84"),
    _f("save_interval", int, 0, "save a checkpoint every N steps", "output",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:84, example/llama3/main.cc:82"),
    _f("max_checkpoint_keep", int, 3, "checkpoints kept", "output", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:87, example/llama3/main.cc:85"),
    _f("save_optimizer_state", bool, True, "save the optimizer state too", "output",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:88, example/llama3/main.cc:86"),
    _f("lora_save_path", str, None, "where LoRA weights are saved", "output",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:99, example/llama3/main.cc:96"),
    _f("freq_generate_txt", int, 10, "text generation every N steps", "output",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:60, example/llama3/main.cc:59"),
    _f("text_length", int, 64, "generated text length", "output", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:61, example/llama3/main.cc:60"),
    _f("tokenizer_bin", str, None, "tokenizer for text generation", "output",
       trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:49, example/llama3/main.cc:48"),
    _f("input_val_bin", str, None, "validation tokens", "output", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:48, example/llama3/main.cc:47"),
    _f("val_loss_every", int, 0, "validation every N steps", "output", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:66, example/llama3/main.cc:65"),
    _f("sample_every", int, 0, "sampling every N steps", "output", trainers={INFINITRAIN},
       source="master@b24d92f:example/gpt2/main.cc:67, example/llama3/main.cc:66"),
    _f("precision_check", str, None, "a module-level trace: every module's forward output "
       "and output gradient, InfiniTrain's format (\"level=1,save_tensors=true,path=DIR\" "
       "writes DIR/<YYYYMMDD_HHMMSS>/precision_check_rank_<R>.log and rank_<R>/*.npy)",
       "output", owner="harness",
       source="master@b24d92f:example/gpt2/main.cc:90, example/llama3/main.cc:89"),
    # InfiniTrain's feature branches (docs/infinitrain_branches.md tables them with their sources).
    _f("context_parallel", int, 1, "context-parallel degree (the sequence split over CP "
       "ranks)", "topology", trainers={INFINITRAIN}, **_POS,
       source="feat/context_parallel@d03ba16:example/gpt2/main.cc:82, example/llama3/main.cc:81"),
    _f("cp_comm_type", str, "p2p", "context-parallel communication (all_gather, p2p, a2a)",
       "topology", trainers={INFINITRAIN}, choices=("all_gather", "p2p", "a2a"),
       source="feat/context_parallel@d03ba16:example/gpt2/main.cc:83 (validator :132), "
       "example/llama3/main.cc:82 (validator :120)"),
    _f("activation_recompute", bool, False, "recompute activations in backward",
       "memory", trainers={INFINITRAIN},
       source="feat/activation_checkpointing@e594d9c:example/gpt2/main.cc:83, "
       "example/llama3/main.cc:82"),
    _f("recompute_granularity", str, "full", "recompute granularity (none, full, selective)",
       "memory", trainers={INFINITRAIN}, choices=("none", "full", "selective"),
       source="feat/activation_checkpointing@e594d9c:example/gpt2/main.cc:84, "
       "example/llama3/main.cc:83"),
    _f("recompute_method", str, "none", "recompute method (none, uniform, block)", "memory",
       trainers={INFINITRAIN}, choices=("none", "uniform", "block"),
       source="feat/activation_checkpointing@e594d9c:example/gpt2/main.cc:85, "
       "example/llama3/main.cc:84"),
    _f("recompute_num_layers", int, 0, "layers per recompute region", "memory",
       trainers={INFINITRAIN}, **_NONNEG,
       source="feat/activation_checkpointing@e594d9c:example/gpt2/main.cc:86, "
       "example/llama3/main.cc:85"),
    # The lr schedule (feat/lr_scheduler): the bundled trainer has the same flags
    # (harness.trainer.lr_schedule), so the PyTorch baseline and the trainer's own cases use them.
    _f("lr_decay_style", str, "constant", "learning-rate decay (none, constant, linear, "
       "cosine, inverse-square-root)", "mathematics",
       # no `choices`: the binary validates its own styles; one the baseline does not know
       # skips the baseline (harness.contracts.semantics.LR_DECAY_STYLES), not the case
       source="feat/lr_scheduler@a7949ac:example/gpt2/main.cc:68 (validator :136), "
       "example/llama3/main.cc:67 (validator :123)"),
    _f("min_lr", float, 0.0, "the decay's floor", "mathematics", **_NONNEG,
       source="feat/lr_scheduler@a7949ac:example/gpt2/main.cc:67, "
       "example/llama3/main.cc:66"),
    _f("lr_warmup_iters", int, 0, "linear warmup iterations", "mathematics",
       **_NONNEG,
       source="feat/lr_scheduler@a7949ac:example/gpt2/main.cc:69, example/llama3/main.cc:68"),
    _f("lr_warmup_init", float, 0.0, "learning rate at the start of warmup", "mathematics",
       **_NONNEG,
       source="feat/lr_scheduler@a7949ac:example/gpt2/main.cc:70, example/llama3/main.cc:69"),
    _f("lr_decay_iters", int, 0, "iterations the decay spans (0: num_iteration)",
       "mathematics", **_NONNEG,
       source="feat/lr_scheduler@a7949ac:example/gpt2/main.cc:71, example/llama3/main.cc:70"),
    _f("micro_batch_size", int, 4, "tiny_mixtral: sequences per microbatch", "mathematics",
       trainers={INFINITRAIN}, **_POS,
       source="feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:25"),
    _f("global_batch_size", int, 4, "tiny_mixtral: sequences per step (global / micro "
       "microbatches accumulated)", "mathematics", trainers={INFINITRAIN}, **_POS,
       source="feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:26, 108"),
    _f("log_interval", int, 1, "tiny_mixtral: print the loss every N steps (0: never)",
       "output", trainers={INFINITRAIN}, **_NONNEG,
       source="feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:34, 140"),
    _f("print_timing", bool, False, "tiny_mixtral: print the loop's time and throughput",
       "output", trainers={INFINITRAIN},
       source="feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:35"),
    # Resume: the reference runs from the start; the resumed steps are compared.
    _f("load", str, None, "checkpoint folder to resume from", "resume", trainers={INFINITRAIN},
       checkpoint_path=True,
       source="master@b24d92f:example/gpt2/main.cc:85, example/llama3/main.cc:83"),
)

FLAG_TABLE: dict[str, Flag] = {flag.name: flag for flag in FLAGS}
HARNESS_FLAGS: tuple[Flag, ...] = tuple(f for f in FLAGS if HARNESS in f.trainers)
CHECKPOINT_PATH_FLAGS: tuple[str, ...] = tuple(f.name for f in FLAGS if f.checkpoint_path)
# InfiniTrain names a checkpoint folder `checkpoint_step_<N>`; a run resumed from it prints
# steps N + 1 on.
_CHECKPOINT_STEP = re.compile(r"checkpoint_step_(\d+)")


def resumed_first_step(load) -> int:
    """The first step a run given `--load=<load>` prints: the checkpoint's step + 1, else 1."""
    match = _CHECKPOINT_STEP.search(str(load or ""))
    return int(match.group(1)) + 1 if match else 1


def run_private(name: str) -> bool:
    """Whether the harness sets this flag per run, to a path of that run's own (output_dir,
    dump_gradients, ...): such a flag says where a run wrote, never what it computed, and
    differs between any two runs."""
    flag = FLAG_TABLE.get(name)
    return flag is not None and flag.owner == "harness" and flag.role == "output"


def role_of(name: str, declared: "DeclaredRoles | None" = None) -> str:
    """A flag's role: the table's; else the one a user declared; else ASSUMED_ROLE (kept)."""
    flag = FLAG_TABLE.get(name)
    if flag:
        return flag.role
    if declared is not None and name in declared.roles:
        return declared.roles[name]
    return ASSUMED_ROLE


def reference_args(args: dict[str, Any],
                   declared: "DeclaredRoles | None" = None) -> dict[str, Any]:
    """The reference rule: the same flags with the topology (and output, resume, memory)
    removed; a flag the table does not know goes by its declared role, else is kept."""
    return {name: value for name, value in args.items()
            if role_of(name, declared) not in DROPPED_BY_REFERENCE}


@dataclass(frozen=True)
class DeclaredRoles:
    """Roles a user declares for flags the table does not know (`--harness-flag-role
    NAME=ROLE`, the config's `flag_roles`): the next trainer flag needs no code change.
    `origin` names where each came from, for messages."""

    roles: dict[str, str]
    origin: dict[str, str]

    @classmethod
    def parse(cls, items, origin: str) -> "DeclaredRoles":
        """From NAME=ROLE items (or a {name: role} mapping), each checked, or FlagError
        naming the item, where it came from and what was expected."""
        pairs = items.items() if isinstance(items, dict) else [
            tuple(str(item).partition("=")[::2]) if "=" in str(item) else (str(item), None)
            for item in items or ()]
        roles, where = {}, {}
        for name, role in pairs:
            if role is None:
                raise FlagError(f"{origin} {name!r}: expected NAME=ROLE")
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise FlagError(f"{origin} {name}={role}: {name!r} is not a flag name "
                                f"(lower case letters, digits and _)")
            if role not in DECLARABLE_ROLES:
                raise FlagError(f"{origin} {name}={role}: {role!r} is not a role; expected one "
                                f"of {', '.join(DECLARABLE_ROLES)}")
            if name in FLAG_TABLE and FLAG_TABLE[name].role != role:
                known = FLAG_TABLE[name]
                raise FlagError(f"{origin} {name}={role}: the flag table gives --{name} the "
                                f"role {known.role!r} ({known.source or 'the harness'}); a "
                                f"declaration is for flags it does not know")
            roles[name], where[name] = role, origin
        return cls(roles, where)

    def over(self, base: "DeclaredRoles") -> "DeclaredRoles":
        """These declarations over `base`'s (the command line over the config file)."""
        return DeclaredRoles({**base.roles, **self.roles}, {**base.origin, **self.origin})


NO_DECLARED_ROLES = DeclaredRoles({}, {})


def unknown_to(trainer: str, names) -> list[str]:
    """The names among `names` that `trainer` does not have."""
    return [n for n in names if n not in FLAG_TABLE or trainer not in FLAG_TABLE[n].trainers]


def expected(flag: Flag) -> str:
    """What a flag's value must be, in words."""
    if flag.type is bool:
        return "true or false"
    if flag.type is int:
        if flag.value_range == SEED_RANGE:
            return "an integer from -2**63 to 2**64-1"
        if flag.value_range:
            return f"an integer from {flag.value_range[0]} to {flag.value_range[1]}"
        if flag.minimum == 1:
            return "a positive integer"
        return "an integer" if flag.minimum is None else f"an integer >= {flag.minimum}"
    if flag.type is float:
        return "a finite number" + ("" if flag.minimum is None else f" >= {flag.minimum:g}")
    if flag.choices:
        return "one of " + ", ".join(flag.choices)
    return "a string"


def check_value(flag: Flag, value: Any) -> Any:
    try:
        return _typed_value(flag, value)
    except (TypeError, ValueError):
        raise FlagError(f"--{flag.name}={value!r}: expected {expected(flag)}") from None


def _typed_value(flag: Flag, value: Any) -> Any:
    """The typed value; TypeError / ValueError when it is not one the flag takes."""
    if isinstance(value, str) and flag.type is not str:
        text = value.strip().lower()
        if flag.type is bool:
            if text not in ("true", "false", "1", "0"):
                raise ValueError(value)
            value = text in ("true", "1")
        else:
            value = flag.type(text)  # int("1.5") and float("x") raise ValueError
    if isinstance(value, bool) is not (flag.type is bool):
        raise TypeError(value)
    if flag.type is int and not isinstance(value, int):
        raise TypeError(value)
    if flag.type is float:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(value)
        value = float(value)
    if flag.type is str and not isinstance(value, str):
        raise TypeError(value)
    if flag.minimum is not None and value < flag.minimum:
        raise ValueError(value)
    if flag.value_range and not flag.value_range[0] <= value <= flag.value_range[1]:
        raise ValueError(value)
    if flag.choices and value not in flag.choices:
        raise ValueError(value)
    return value


# 16x the largest published step (LLaMA 3 405B: 16M tokens); its int64 inputs and targets are
# 4 GiB already.
MAX_STEP_TOKENS = 2**28


def microbatches(total_batch_size: int, batch_size: int, sequence_length: int,
                 data_parallel: int) -> int:
    """Microbatches per data-parallel rank per step, or FlagError: total_batch_size =
    microbatches * batch_size * sequence_length * data_parallel, exactly. A step of more than
    MAX_STEP_TOKENS tokens is refused: a process holds the whole step's tokens (inputs and
    targets, int64) before it trains on them."""
    if total_batch_size > MAX_STEP_TOKENS:
        raise FlagError(
            f"--total_batch_size={total_batch_size} tokens per step is more than "
            f"{MAX_STEP_TOKENS} (2**28); expected a step a process can hold")
    per_pass = batch_size * sequence_length * data_parallel
    if total_batch_size % per_pass:
        raise FlagError(
            f"--total_batch_size={total_batch_size} is not a multiple of --batch_size * "
            f"--sequence_length * data-parallel size = {batch_size} * {sequence_length} * "
            f"{data_parallel} = {per_pass}")
    return total_batch_size // per_pass


def flag_argv(flags: dict[str, Any]) -> list[str]:
    """`--name=value` items (booleans as true / false, as gflags and our trainer read them)."""
    argv = []
    for name, value in flags.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        argv.append(f"--{name}={value}")
    return argv



def foreign_role_table() -> list[str]:
    """InfiniTrain's own flags that carry a source, with their roles, as a markdown table
    (docs/infinitrain_branches.md holds it; a test keeps the two equal)."""
    lines = ["| flag | role | the reference | source |", "| --- | --- | --- | --- |"]
    for flag in FLAGS:
        if flag.source:
            action = ("drops it" if flag.role in DROPPED_BY_REFERENCE else
                      "the harness sets it per run" if flag.role == "input" else "keeps it")
            lines.append(f"| `--{flag.name}` | {flag.role} | {action} | "
                         f"{flag.source.replace('|', chr(92) + '|')} |")
    return lines
