"""Command-line flags of the reference trainer.

Names are InfiniTrain's (and llm.c's) so their users feel at home; the dash spelling of every
flag is accepted too (`--batch-size` for `--batch_size`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

from harness.contracts.flags import (  # noqa: F401  (re-exported: the trainer's vocabulary)
    DEVICES,
    DTYPES,
    FLAG_TABLE,
    HARNESS_FLAGS,
    OPTIMIZERS,
    SCHEDULES,
    SEED_RANGE,
    TRAINER_DTYPES,
    FlagError,
    expected,
    microbatches,
)
from harness.contracts.models import MODEL_SPECS

MODELS = tuple(MODEL_SPECS)  # every registered model family


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
    # the lr schedule (harness.trainer.lr_schedule; InfiniTrain's feat/lr_scheduler flags)
    lr_decay_style: str = "constant"
    min_lr: float = 0.0
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: int = 0
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    adam_beta2: float = 0.95
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
    dump_parameter_updates: str | None = None
    output_dir: str | None = None
    profile_layers: str | None = None
    precision_check: str | None = None  # harness.trainer.precision_check: the option string

    def lr_schedule(self):
        """The lr schedule these flags ask for (FlagError when the branch's checks refuse it)."""
        from harness.trainer.lr_schedule import LRSchedule

        return LRSchedule.from_flags(self.lr_decay_style, self.learning_rate, self.min_lr,
                                     self.lr_warmup_iters, self.lr_warmup_init,
                                     self.lr_decay_iters, self.num_iteration)

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


def _typed(flag):
    """An argparse `type` that checks a value against the flag table's entry."""
    def parse(text: str):
        try:
            return flag.check(text)
        except FlagError:
            raise argparse.ArgumentTypeError(f"expected {expected(flag)}, got {text!r}") from None
    parse.__name__ = flag.type.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.trainer",
        description="Reference GPT-2 / LLaMA 3 / Mixtral (MoE) trainer on llm.c-style files "
        "(launch with torchrun for pipeline, tensor and data parallelism).",
        allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = TrainerFlags()
    for field in fields(TrainerFlags):
        name = field.name
        option_strings = [f"--{name}"]
        if "_" in name:
            option_strings.append(f"--{name.replace('_', '-')}")
        flag = FLAG_TABLE[name]
        kwargs: dict = {"dest": name, "default": getattr(defaults, name), "help": flag.help}
        if flag.type is bool:
            # InfiniTrain (gflags) writes `--flag`, `--flag=true` and `--flag=false`.
            kwargs.update(nargs="?", const=True, type=_bool, metavar="BOOL")
        elif name == "model":
            kwargs["choices"] = MODELS
        elif name == "dtype":  # float64 too: the calibration's oracle (one device)
            kwargs["choices"] = TRAINER_DTYPES
        elif flag.choices:
            kwargs["choices"] = flag.choices
        elif flag.type is not str:
            kwargs["type"] = _typed(flag)
        parser.add_argument(*option_strings, **kwargs)
    return parser


def parse_flags(argv: Sequence[str] | None = None) -> TrainerFlags:
    """Parse argv; unknown flags and bad values exit with argparse's usage error (code 2)."""
    namespace = build_parser().parse_args(argv)
    return TrainerFlags(**vars(namespace))


def check_batch_arithmetic(flags: TrainerFlags, data_parallel: int) -> int:
    """The microbatches per data-parallel rank, or FlagError (the arithmetic is the spec's)."""
    return microbatches(flags.step_tokens, flags.batch_size, flags.sequence_length, data_parallel)
