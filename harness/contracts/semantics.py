"""What InfiniTrain's programs compute, as the bundled PyTorch trainer's flags: the semantics
the live baseline (`--harness-baseline pytorch`) runs a case of InfiniTrain's with.

Every fact names its source line in InfiniTrain (master b24d92f) and what the baseline does
with it; docs/infinitrain.md tables them (`fact_table()`), and tests/baseline/test_semantics.py
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
    Fact("the learning rate is constant: no schedule flag, the step line prints "
         "FLAGS_learning_rate", "example/gpt2/main.cc:495, example/llama3/main.cc:472",
         "the bundled trainer's constant `--learning_rate`"),
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

# The program each model runs, and the optimizer it steps with (FACTS 0-2).
OPTIMIZER_FLAGS: dict[str, dict[str, Any]] = {
    "gpt2": {"optimizer": "sgd"},
    "llama3": {"optimizer": "adamw", "weight_decay": 0.0, "adam_beta2": 0.999},
}
# Case flags the baseline carries over as they are; the ones a case leaves out take the
# binary's listed default (FACT 4).
CARRIED = ("dtype", "batch_size", "sequence_length", "total_batch_size", "num_iteration",
           "learning_rate")
# Flags whose value changes nothing the baseline computes.
IGNORED = {"overfit_single_batch": "a no-op in InfiniTrain master (FACTS: the loader's reset "
                                   "is commented out)"}
LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_load_path")


class BaselineUnmatched(ValueError):
    """The bundled trainer cannot run what this case computes; str() is the skip reason."""


def baseline_flags(model: str, args: dict[str, Any],
                   listed_default: Callable[[str], str | None]) -> dict[str, Any]:
    """The bundled trainer's flags for the PyTorch baseline of a case of InfiniTrain's `model`
    with flags `args` (as the config gives them), one device. `listed_default(flag)` is the
    binary's `--helpxml` default of a flag, or None. BaselineUnmatched says why none can be."""
    if model not in OPTIMIZER_FLAGS:
        raise BaselineUnmatched(f"no PyTorch semantics recorded for InfiniTrain's {model!r} "
                                f"program (known: {', '.join(OPTIMIZER_FLAGS)})")
    kept = reference_args(args)  # topology, output and resume dropped (the reference rule)
    if int(kept.get("lora_rank", 0) or 0) > 0:
        raise BaselineUnmatched(f"LoRA (--lora_rank={kept['lora_rank']}): the bundled trainer "
                                f"has no LoRA adapters")
    unmatched = sorted(name for name in kept
                       if name not in CARRIED and name not in IGNORED and name not in LORA_FLAGS)
    if unmatched:
        raise BaselineUnmatched(
            f"{', '.join('--' + n for n in unmatched)}: no recorded counterpart in the bundled "
            f"trainer (harness.contracts.semantics)")
    flags: dict[str, Any] = {}
    for name in CARRIED:
        value = kept.get(name)
        if value is None:
            listed = listed_default(name)
            if listed is None:
                raise BaselineUnmatched(f"--{name}: the case leaves it out and the binary's "
                                        f"--helpxml listing gives no default")
            value = listed
        try:
            flags[name] = FLAG_TABLE[name].check(value)
        except FlagError as error:
            raise BaselineUnmatched(f"{error} (the binary's value, for the baseline)") from None
    return {**flags, **OPTIMIZER_FLAGS[model]}


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
    """The facts as a markdown table (docs/infinitrain.md holds it; a test keeps them equal)."""
    lines = ["| what InfiniTrain does | source (" + REVISION + ") | the PyTorch baseline |",
             "| --- | --- | --- |"]
    lines += [f"| {f.subject} | {f.source} | {f.baseline} |" for f in FACTS]
    return lines
