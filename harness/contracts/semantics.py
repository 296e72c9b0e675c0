"""What InfiniTrain's programs compute, as the bundled PyTorch trainer's flags: the semantics
the live baseline (`--harness-baseline pytorch`) runs a case of InfiniTrain's with.

Every fact names its source line in InfiniTrain (master b24d92f) and what the baseline does
with it; docs/infinitrain_baseline.md tables them (`fact_table()`), and tests/baseline/test_semantics.py
tests each. A case flag with no fact here has no known counterpart in the bundled trainer: the
baseline is skipped with that reason, never run with a guess.

The baseline of a case is one device: the case's reference flags (harness.contracts.flags: the
topology, output and resume flags dropped), the program's optimizer, and for every
hyper-parameter the case leaves out, the default the binary's own `--helpxml` listing gives
(InfiniTrain's defaults differ from the bundled trainer's: `--total_batch_size` 256, llama3's
`--learning_rate` 1e-5). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness.contracts.flags import FLAG_TABLE, FlagError, reference_args
from harness.contracts.programs import PROGRAMS

REVISION = "InfiniTensor/InfiniTrain master b24d92f"


@dataclass(frozen=True)
class Fact:
    subject: str  # what InfiniTrain does
    source: str  # file:line in InfiniTrain at REVISION
    baseline: str  # what the PyTorch baseline does about it


FACTS: tuple[Fact, ...] = (
    Fact("gpt2 steps with plain SGD at --learning_rate", "example/gpt2/main.cc:320 "
         "`optimizers::SGD::Create(FLAGS_learning_rate)`", "`--optimizer sgd`"),
    Fact("llama3 steps with Adam at --learning_rate", "example/llama3/main.cc:291 "
         "`optimizers::Adam::Create(FLAGS_learning_rate)`",
         "`--optimizer adamw --weight_decay 0`"),
    Fact("Adam's betas (0.9, 0.999), eps 1e-8, bias-corrected, no weight decay",
         "infini_train/include/optimizer.h:57; kernels/cpu/accumulate_grad.cc:22-31",
         "`--adam_beta2 0.999` (beta1 0.9 and eps 1e-8 are the bundled trainer's own)"),
    Fact("the learning rate is constant on master: no schedule flag, the step line prints "
         "FLAGS_learning_rate", "example/gpt2/main.cc:495, example/llama3/main.cc:472",
         "the bundled trainer's constant `--learning_rate` (its default `--lr_decay_style "
         "constant`)"),
    Fact("feat/lr_scheduler: five schedules, `--lr_decay_style` none, constant, linear, "
         "cosine or inverse-square-root, with `--min_lr`, `--lr_warmup_iters`, `--lr_warmup_init`, "
         "`--lr_decay_iters` (0: `--num_iteration`); a style outside these is refused by the "
         "binary's validator", "feat/lr_scheduler@a7949ac:example/gpt2/main.cc:67-71, 119-120, "
         "136-137, 328-336; example/llama3/main.cc:65-70, 115-116, 123-124, 308-316",
         "the same flags, carried where the case or the binary's listing has them "
         "(harness.trainer.lr_schedule); a style the bundled trainer does not compute skips "
         "the baseline, naming it"),
    Fact("the schedules' formulas: warmup `init + (max - init) k/W` for k < W; `none` no "
         "scheduler (the flag lr); `constant` max, min_lr and the decay unused; `linear` max "
         "to min over D - W steps; `cosine` `min + (max - min)(cos(pi j/(D - W)) + 1)/2`, min "
         "after; `inverse-square-root` `max(min, max sqrt(max(W,1))/sqrt(max(k,1)))`, min after "
         "D; the CHECKs: max > 0, 0 <= min <= max, 0 <= init <= max, D > 0, W < D",
         "feat/lr_scheduler@a7949ac:infini_train/src/lr_scheduler.cc:16-83",
         "the same closed forms in float64 (harness.trainer.lr_schedule.LRSchedule); the same "
         "checks refuse the run (exit 2) naming the flag"),
    Fact("the step a schedule steps on: lr(0) is applied when the scheduler is made, it steps "
         "once after every optimizer step, and the step line prints the lr read before the "
         "update, so step n trains at and prints lr(n - 1)",
         "feat/lr_scheduler@a7949ac:infini_train/include/lr_scheduler.h:30-34; "
         "example/gpt2/main.cc:428, 473-476, 507; example/llama3/main.cc:406, 451-453, 484",
         "step n trains at lr(n - 1), recorded in its step; the baseline check compares the "
         "printed lr of every step within print resolution (`{:.2e}`: one unit of the coarser "
         "side; `0.00e+00` is exact)"),
    Fact("qwen3 steps with Adam at --learning_rate, betas (0.9, 0.95), eps 1e-8, no schedule: "
         "the step line prints FLAGS_learning_rate",
         "feat/add_Qwen3-8B@a3f84f8:example/qwen3/main.cc:263 "
         "`optimizers::Adam::Create(FLAGS_learning_rate, 0.9f, 0.95f, 1e-8f)`, :393-397",
         "`--model qwen3 --optimizer adamw --weight_decay 0 --adam_beta2 0.95`"),
    Fact("mixtral (tiny_mixtral renamed) steps, batches and loads as tiny_mixtral: Adam at "
         "`--learning_rate`, micro / global batch flags, the same checkpoint header (magic "
         "20260513, version 2) and tensor order; its step line adds peak used / reserved MB",
         "later@ed83c8b:example/mixtral/main.cc:30-34, 107, 155-159; later@2ff4941:"
         "example/mixtral/checkpoint_loader.cc:22-24, 45-66, 139-165",
         "tiny_mixtral's flags (`--model mixtral`), the step line's loss read with its peak "
         "fields"),
    Fact("tiny_mixtral steps with Adam at `--learning_rate`, no schedule: the step line prints "
         "FLAGS_learning_rate", "feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:102-103, "
         "140-143",
         "`--model mixtral --optimizer adamw --weight_decay 0 --adam_beta2 0.999`"),
    Fact("Adam keeps one step count for all parameters, advanced every step; a parameter "
         "without a gradient (an expert no token chose: ZeroGrad sets gradients to none) is "
         "skipped", "feat/support_moe@b7e0760:infini_train/src/optimizer.cc:53-62; "
         "infini_train/include/optimizer.h:22 (ZeroGrad(set_to_none = true))",
         "`--optimizer adamw` bias-corrects every parameter at the run's step "
         "(harness/trainer/main.py `_one_adam_step_count`; torch counts per parameter)"),
    Fact("tiny_mixtral's batch counts sequences: `global_batch_size / micro_batch_size` "
         "microbatches, each loss divided by their count; one device; the same token loader as "
         "gpt2's (consecutive sequences, no shuffle, wrapping at the end)",
         "feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:87-89, 108-131",
         "`--batch_size` micro_batch_size, `--total_batch_size` global_batch_size x "
         "sequence_length tokens"),
    Fact("defaults of the hyper-parameters a case leaves out", "the binary's `--helpxml` "
         "listing (example/gpt2/main.cc:55-63: batch 4, sequence 64, total 256 tokens, 10 "
         "steps, lr 1e-4; example/llama3/main.cc:62: lr 1e-5)",
         "each default read from the listing of the binary under test"),
    Fact("gradient accumulation: total_batch_size / (batch x sequence x DP) microbatches, each "
         "loss divided by their count", "example/gpt2/main.cc:204, 452; "
         "example/llama3/main.cc:190, 429",
         "the same arithmetic (harness.contracts.flags.microbatches), on one device"),
    Fact("tokens read in order, no shuffle; DP rank r reads every DP-th batch, so the ranks "
         "together read the single-device batches", "example/gpt2/main.cc:298, "
         "example/llama3/main.cc:270 (DistributedDataLoader)",
         "one device reads the same tokens in the same order"),
    Fact("--overfit_single_batch (default true) does nothing: the loader's reset is commented "
         "out", "example/gpt2/main.cc:429, example/llama3/main.cc:407",
         "ignored"),
    Fact("bfloat16: autocast over float32 parameters and gradients", "example/gpt2/main.cc:434,"
         " example/llama3/main.cc:412 (AutocastGuard)",
         "`--dtype bfloat16`: torch.autocast over float32 parameters"),
    Fact("LoRA (--lora_rank > 0) injects adapters and trains only them",
         "example/gpt2/main.cc:238, example/llama3/main.cc:219 (GetLoRAModel)",
         "skipped: the bundled trainer has no LoRA"),
    Fact("a resumed run (--load) continues the uninterrupted run: gpt2's SGD has no state "
         "(load_optimizer_state false), llama3 loads Adam's", "example/gpt2/main.cc:351, "
         "example/llama3/main.cc:330",
         "run from the start; the resumed steps are compared with its same steps"),
    Fact("#209's gradient dump names a parameter as its state dict does: `transformer.` before "
         "the embeddings, blocks and final norm, `lm_head.weight` without; at PP 1 `lm_head` "
         "is `wte` itself (tied), so both files hold the one gradient",
         "infini_train/include/nn/modules/transformer/transformer.h:72 (kTransformerModelName "
         "\"transformer\"); infini_train/src/nn/modules/transformer/transformer.cc:248, 256 "
         "(the tie only when GetPipelineParallelSize() == 1)",
         "`--dump_gradients` after the first step under llm.c's names (`transformer.` "
         "dropped; its tied `wte.weight` also read as `lm_head.weight`); compared parameter "
         "by parameter with the case's dump"),
    Fact("gpt2 at TP 1 holds the real vocabulary (vocab_size rows of wte / lm_head) and skips "
         "the file's padded rows; under TP the padded one", "example/gpt2/checkpoint_loader.cc"
         ":82 `tp_size > 1 ? padded_vocab_size : vocab_size`, :149-152",
         "its padded vocabulary's gradient compared over the subject's rows at TP 1 (the "
         "padded rows' logits are cut off, so they carry none)"),
)

# The lr schedules the bundled trainer computes (harness.trainer.lr_schedule), the same as
# feat/lr_scheduler@a7949ac:example/gpt2/main.cc:119-120 (kSupportedLRDecayStyles). A case's
# style outside these skips its baseline, naming it.
LR_DECAY_STYLES = ("none", "constant", "linear", "cosine", "inverse-square-root")
# feat/lr_scheduler's schedule flags: carried where the case or the binary's listing has them;
# a binary without them (master) runs at a constant --learning_rate, the bundled default.
SCHEDULE_FLAGS = ("lr_decay_style", "min_lr", "lr_warmup_iters", "lr_warmup_init",
                  "lr_decay_iters")


@dataclass(frozen=True)
class ProgramSemantics:
    """What one InfiniTrain program computes, as the bundled trainer's flags (its --model is
    the program's `family` fact, harness.contracts.programs)."""
    optimizer: dict[str, Any]  # FACTS: the optimizer it steps with
    # the program's batch flags (harness.contracts.programs: batch_flags), carried like the
    # others, -> the bundled trainer's --batch_size and --total_batch_size (tokens)
    batch: Callable[[dict[str, Any]], dict[str, int]]


# Carried as they are (else the binary's listed default), beside the program's batch flags.
CARRIED = ("dtype", "sequence_length", "num_iteration", "learning_rate")
ADAM = {"optimizer": "adamw", "weight_decay": 0.0, "adam_beta2": 0.999}


def _master_batch(flags: dict[str, Any]) -> dict[str, int]:
    return {"batch_size": flags["batch_size"], "total_batch_size": flags["total_batch_size"]}


def _mixtral_batch(flags: dict[str, Any]) -> dict[str, int]:
    """global_batch_size counts sequences (FACTS: tiny_mixtral's batch)."""
    return {"batch_size": flags["micro_batch_size"],
            "total_batch_size": flags["global_batch_size"] * flags["sequence_length"]}


PROGRAM_SEMANTICS: dict[str, ProgramSemantics] = {
    "gpt2": ProgramSemantics({"optimizer": "sgd"}, _master_batch),
    "llama3": ProgramSemantics(ADAM, _master_batch),
    "qwen3": ProgramSemantics({**ADAM, "adam_beta2": 0.95}, _master_batch),
    "tiny_mixtral": ProgramSemantics(ADAM, _mixtral_batch),
    "mixtral": ProgramSemantics(ADAM, _mixtral_batch),
}
# Flags whose value changes nothing the baseline computes.
IGNORED = {"overfit_single_batch": "a no-op in InfiniTrain master (FACTS: the loader's reset "
                                   "is commented out)"}
LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_load_path")


class BaselineUnmatched(ValueError):
    """The bundled trainer cannot run what this case computes; str() is the skip reason."""


def baseline_flags(model: str, args: dict[str, Any],
                   listed_default: Callable[[str], str | None]) -> dict[str, Any]:
    """The bundled trainer's flags (its `model`, the family, among them) for the PyTorch
    baseline of a case of InfiniTrain's `model` with flags `args` (as the config gives them),
    one device. `listed_default(flag)` is the binary's `--helpxml` default of a flag, or None.
    BaselineUnmatched says why none can be."""
    if model not in PROGRAM_SEMANTICS:
        raise BaselineUnmatched(f"no PyTorch semantics recorded for InfiniTrain's {model!r} "
                                f"program (known: {', '.join(PROGRAM_SEMANTICS)})")
    semantics = PROGRAM_SEMANTICS[model]
    family = PROGRAMS[model].family
    if family is None:
        raise BaselineUnmatched(f"InfiniTrain's {model} program has no family in the bundled "
                                f"trainer ({PROGRAMS[model].source('family')})")
    kept = reference_args(args)  # topology, output and resume dropped (the reference rule)
    if int(kept.get("lora_rank", 0) or 0) > 0:
        raise BaselineUnmatched(f"LoRA (--lora_rank={kept['lora_rank']}): the bundled trainer "
                                f"has no LoRA adapters")
    carried_names = (*CARRIED, *PROGRAMS[model].batch_flags)
    known = (*carried_names, *SCHEDULE_FLAGS, *IGNORED, *LORA_FLAGS)
    unmatched = sorted(name for name in kept if name not in known)
    if unmatched:
        raise BaselineUnmatched(
            f"{', '.join('--' + n for n in unmatched)}: no recorded counterpart in the bundled "
            f"trainer for InfiniTrain's {model} (harness.contracts.semantics)")
    carried = {name: _value(name, kept, listed_default, required=True)
               for name in carried_names}
    schedule = {name: value for name in SCHEDULE_FLAGS  # where the case or this binary has them
                if (value := _value(name, kept, listed_default, required=False)) is not None}
    style = schedule.get("lr_decay_style")
    if style is not None and style not in LR_DECAY_STYLES:
        raise BaselineUnmatched(f"--lr_decay_style={style}: the bundled trainer computes "
                                f"{', '.join(LR_DECAY_STYLES)} (harness.trainer.lr_schedule)")
    return {"model": family, **{name: carried[name] for name in CARRIED},
            **semantics.batch(carried), **schedule, **semantics.optimizer}


def _value(name: str, kept: dict[str, Any], listed_default: Callable[[str], str | None],
           required: bool) -> Any:
    """A flag's typed value: the case's, else the binary's listed default; None (or, when
    `required`, BaselineUnmatched) when neither has one."""
    value = kept.get(name)
    if value is None:
        value = listed_default(name)
        if value is None:
            if required:
                raise BaselineUnmatched(f"--{name}: the case leaves it out and the binary's "
                                        f"--helpxml listing gives no default")
            return None
    try:
        return FLAG_TABLE[name].check(value)
    except FlagError as error:
        raise BaselineUnmatched(f"{error} (the binary's value, for the baseline)") from None


# The vocabulary-sized parameters, under the bundled trainer's names (FACTS: the vocabulary).
VOCABULARY_PARAMETERS = frozenset({"wte.weight", "lm_head.weight"})
# The prefix the subject's gradient dump puts before a parameter's llm.c name, per program
# (FACTS: the gradient dump). Only gpt2: #209 gives llama3 no --dump_gradients, so its names
# were never seen, and are not guessed.
GRADIENT_NAME_PREFIX: dict[str, str] = {"gpt2": "transformer."}


def baseline_parameter_name(model: str, name: str) -> str:
    """The bundled trainer's name of the parameter the subject's dump of `model` calls `name`
    (`transformer.h.3.attn.c_attn.weight` -> `h.3.attn.c_attn.weight`; `lm_head.weight` as it
    is). BaselineUnmatched for a program with no recorded dump naming."""
    if model not in GRADIENT_NAME_PREFIX:
        raise BaselineUnmatched(f"no gradient dump naming recorded for InfiniTrain's {model!r} "
                                f"program (known: {', '.join(GRADIENT_NAME_PREFIX)})")
    prefix = GRADIENT_NAME_PREFIX[model]
    return name[len(prefix):] if name.startswith(prefix) else name


def fact_table() -> list[str]:
    """The facts as a markdown table (docs/infinitrain_baseline.md holds it; a test keeps them equal)."""
    return facts_table(FACTS, REVISION)


def facts_table(facts: tuple[Fact, ...], revision: str) -> list[str]:
    """Facts of one revision as a markdown table (this module's; harness.contracts.mixtral_facts)."""
    lines = ["| what InfiniTrain does | source (" + revision + ") | the PyTorch baseline |",
             "| --- | --- | --- |"]
    lines += [f"| {f.subject} | {f.source} | {f.baseline} |" for f in facts]
    return lines
