"""Command-line flags of the reference trainer.

Names are InfiniTrain's (and llm.c's) so their users feel at home; the dash spelling of every
flag is accepted too (`--batch-size` for `--batch_size`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

MODELS = ("gpt2", "llama3")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("sgd", "adamw")
# The schedule names torch.distributed.pipelining knows (get_schedule_class spells them so).
SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


class FlagError(ValueError):
    """A flag value the trainer cannot run with; the message names the flag."""


@dataclass(frozen=True)
class TrainerFlags:
    model: str | None = None
    llmc_filepath: str | None = None
    input_bin: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 4
    sequence_length: int = 64
    total_batch_size: int | None = None
    num_iteration: int = 10
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    seed: int = 42
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1
    virtual_pipeline_parallel: int = 1
    pipeline_layer_partition: str | None = None
    pipeline_layer_costs: str | None = None
    pipeline_chunk_layout: str | None = None
    pipeline_model_parallel_layout: str | None = None
    pipeline_schedule: str | None = None
    dump_gradients: str | None = None
    output_dir: str | None = None
    profile_layers: str | None = None

    @property
    def tokens_per_microbatch(self) -> int:
        return self.batch_size * self.sequence_length

    @property
    def step_tokens(self) -> int:
        """Tokens per optimizer step over all ranks (--total_batch_size, default one microbatch)."""
        return self.total_batch_size or self.tokens_per_microbatch


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


# torch.manual_seed takes any integer in this range (a larger one overflows inside torch).
SEED_RANGE = (-(2**63), 2**64 - 1)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(
            f"expected an integer from -2**63 to 2**64-1, got {text!r}")
    return value


_TYPES = {
    "batch_size": _positive_int,
    "sequence_length": _positive_int,
    "total_batch_size": _positive_int,
    "num_iteration": _positive_int,
    "tensor_parallel": _positive_int,
    "pipeline_parallel": _positive_int,
    "virtual_pipeline_parallel": _positive_int,
    "learning_rate": _non_negative_float,
    "weight_decay": _non_negative_float,
    "seed": _seed,
}
_CHOICES = {
    "model": MODELS,
    "device": DEVICES,
    "dtype": DTYPES,
    "optimizer": OPTIMIZERS,
    "pipeline_schedule": SCHEDULES,
}
_HELP = {
    "model": "gpt2 or llama3 (default: what the checkpoint holds; must agree with it)",
    "llmc_filepath": "llm.c checkpoint to start from",
    "input_bin": "llm.c token file to train on",
    "device": "cpu (gloo) or cuda (nccl)",
    "dtype": "compute dtype; parameters and gradients stay float32",
    "batch_size": "sequences per microbatch on each data-parallel rank",
    "sequence_length": "tokens per sequence",
    "total_batch_size": "tokens per optimizer step over all ranks (default: one microbatch)",
    "num_iteration": "optimizer steps",
    "learning_rate": "constant learning rate",
    "weight_decay": "AdamW weight decay",
    "optimizer": "sgd (plain, as InfiniTrain) or adamw",
    "seed": "seed of every random choice the run makes",
    "tensor_parallel": "tensor-parallel degree",
    "sequence_parallel": "shard norms and dropout-free activations over the TP group",
    "pipeline_parallel": "pipeline stages",
    "virtual_pipeline_parallel": "chunks per pipeline stage (uniform layout)",
    "pipeline_layer_partition": "layers per stage, e.g. 4,8,6,6",
    "pipeline_layer_costs": "per-layer costs to balance, e.g. 1x8,L:4.5",
    "pipeline_chunk_layout": "ordered STAGE:LAYERS chunk list, e.g. 0:3,1:3,1:3,0:3",
    "pipeline_model_parallel_layout": "Megatron-style layout, e.g. 'Et*3|t*3|t*3|t*3NL'",
    "pipeline_schedule": "pipeline schedule (default: the one that fits the layout)",
    "dump_gradients": "write every parameter's gradient after the first step to this folder",
    "output_dir": "where the step records, run record and layout are written",
    "profile_layers": "write per-layer forward/backward timings (JSON lines) to this file",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.trainer",
        description="Reference GPT-2 / LLaMA 3 trainer on llm.c files "
        "(launch with torchrun for pipeline, tensor and data parallelism).",
        allow_abbrev=False,
    )
    defaults = TrainerFlags()
    for field in fields(TrainerFlags):
        name = field.name
        option_strings = [f"--{name}"]
        if "_" in name:
            option_strings.append(f"--{name.replace('_', '-')}")
        kwargs: dict = {"dest": name, "default": getattr(defaults, name), "help": _HELP[name]}
        if field.type in ("bool",) or isinstance(getattr(defaults, name), bool):
            # InfiniTrain (gflags) writes `--flag`, `--flag=true` and `--flag=false`.
            kwargs.update(nargs="?", const=True, type=_bool, metavar="BOOL")
        else:
            kwargs["type"] = _TYPES.get(name, str)
            if name in _CHOICES:
                kwargs["choices"] = _CHOICES[name]
        parser.add_argument(*option_strings, **kwargs)
    return parser


def parse_flags(argv: Sequence[str] | None = None) -> TrainerFlags:
    """Parse argv; unknown flags and bad values exit with argparse's usage error (code 2)."""
    namespace = build_parser().parse_args(argv)
    return TrainerFlags(**vars(namespace))


def check_batch_arithmetic(flags: TrainerFlags, data_parallel: int) -> int:
    """Return the microbatches per data-parallel rank, or raise FlagError.

    total_batch_size = microbatches * batch_size * sequence_length * data_parallel, exactly.
    """
    per_pass = flags.tokens_per_microbatch * data_parallel
    if flags.step_tokens % per_pass:
        raise FlagError(
            f"--total_batch_size={flags.step_tokens} is not a multiple of "
            f"--batch_size * --sequence_length * data-parallel size = "
            f"{flags.batch_size} * {flags.sequence_length} * {data_parallel} = {per_pass}"
        )
    return flags.step_tokens // per_pass
