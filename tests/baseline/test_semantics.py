"""The PyTorch baseline's semantics of InfiniTrain's programs (harness.contracts.semantics): each
fact, the defaults read from the binary's listing, and the cases it refuses with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.contracts.semantics import FACTS, BaselineUnmatched, baseline_flags, fact_table

# What InfiniTrain master's --helpxml lists as defaults (example/gpt2/main.cc:55-63,
# example/llama3/main.cc:54-62), as gflags prints them.
LISTED = {
    "gpt2": {"batch_size": "4", "sequence_length": "64", "total_batch_size": "256",
             "num_iteration": "10", "learning_rate": "0.0001", "dtype": "float32"},
    "llama3": {"batch_size": "4", "sequence_length": "64", "total_batch_size": "256",
               "num_iteration": "10", "learning_rate": "1.0000000000000001e-05",
               "dtype": "float32"},
}


def flags(model, args, listed=None):
    return baseline_flags(model, args, (listed or LISTED[model]).get)


def test_gpt2_steps_with_plain_sgd_and_llama3_with_adam_betas_0_9_0_999():
    assert flags("gpt2", {})["optimizer"] == "sgd"
    llama = flags("llama3", {})
    assert (llama["optimizer"], llama["weight_decay"], llama["adam_beta2"]) == \
        ("adamw", 0.0, 0.999)


def test_what_a_case_leaves_out_is_the_binarys_listed_default():
    got = flags("llama3", {"dtype": "float32"})
    assert got["learning_rate"] == pytest.approx(1e-5)  # not the bundled trainer's 1e-4
    assert got["total_batch_size"] == 256  # not the bundled trainer's one microbatch
    assert (got["batch_size"], got["sequence_length"], got["num_iteration"]) == (4, 64, 10)


def test_the_cases_own_values_win_over_the_listing():
    got = flags("gpt2", {"batch_size": 80, "total_batch_size": 5120, "num_iteration": 3,
                         "learning_rate": "2e-4", "dtype": "bfloat16"})
    assert (got["batch_size"], got["total_batch_size"], got["num_iteration"], got["dtype"]) == \
        (80, 5120, 3, "bfloat16")
    assert got["learning_rate"] == pytest.approx(2e-4)


def test_topology_output_and_resume_are_dropped_the_global_batch_kept():
    """A parallel case's baseline is the single-device run of the same global batch."""
    parallel = {"nthread_per_process": 8, "tensor_parallel": 4, "sequence_parallel": True,
                "pipeline_parallel": 2, "zero_stage": 1, "batch_size": 40,
                "total_batch_size": 5120, "save": "/c", "save_interval": 10,
                "load": "/c/checkpoint_step_000030", "num_iteration": 50}
    got = flags("gpt2", parallel)
    assert set(got) == {"model", "dtype", "batch_size", "sequence_length", "total_batch_size",
                        "num_iteration", "learning_rate", "optimizer"}
    assert (got["batch_size"], got["total_batch_size"], got["num_iteration"]) == (40, 5120, 50)


def test_overfit_single_batch_is_a_no_op_and_ignored():
    assert flags("gpt2", {"overfit_single_batch": True}) == flags("gpt2", {})


def test_lora_is_skipped_with_the_reason_and_rank_0_is_no_lora():
    with pytest.raises(BaselineUnmatched, match="LoRA .*no LoRA"):
        flags("gpt2", {"lora_rank": 8, "lora_alpha": 16.0, "lora_target_modules": "c_attn"})
    assert flags("gpt2", {"lora_rank": 0}) == flags("gpt2", {})


def test_a_flag_without_a_recorded_counterpart_is_skipped_never_guessed():
    with pytest.raises(BaselineUnmatched, match="--warmup_steps: no recorded counterpart"):
        flags("gpt2", {"warmup_steps": 10})


def test_a_listing_without_the_default_is_a_reason_not_the_bundled_trainers_default():
    listed = {k: v for k, v in LISTED["gpt2"].items() if k != "total_batch_size"}
    with pytest.raises(BaselineUnmatched, match="--total_batch_size: .*gives no default"):
        flags("gpt2", {}, listed)


def test_an_unknown_program_has_no_semantics():
    with pytest.raises(BaselineUnmatched, match="InfiniTrain's 'gemma' program"):
        flags("gemma", {}, LISTED["gpt2"])


def test_qwen3_steps_with_its_own_adam_betas():
    got = flags("qwen3", {}, {**LISTED["gpt2"], "learning_rate": "1e-05"})
    assert (got["model"], got["optimizer"], got["adam_beta2"]) == ("qwen3", "adamw", 0.95)


# What feat/lr_scheduler's gpt2 lists besides master's (example/gpt2/main.cc:67-71).
LR_LISTED = {**LISTED["gpt2"], "lr_decay_style": "constant", "min_lr": "0",
             "lr_warmup_iters": "0", "lr_warmup_init": "0", "lr_decay_iters": "0"}


def test_a_schedule_is_carried_from_the_case_and_the_branchs_listing():
    case = {"learning_rate": 1e-5, "min_lr": 1e-6, "lr_decay_style": "cosine",
            "lr_warmup_iters": 2, "lr_warmup_init": 0.0, "lr_decay_iters": 10,
            "pipeline_parallel": 8}
    got = flags("gpt2", case, LR_LISTED)
    assert {k: got[k] for k in ("lr_decay_style", "min_lr", "lr_warmup_iters",
                                "lr_decay_iters")} == {"lr_decay_style": "cosine",
                                                       "min_lr": 1e-6, "lr_warmup_iters": 2,
                                                       "lr_decay_iters": 10}
    # a case that leaves the schedule out runs the branch's listed default, constant
    assert flags("gpt2", {}, LR_LISTED)["lr_decay_style"] == "constant"
    # master lists no schedule flag: none is passed, the bundled trainer's constant lr runs
    assert "lr_decay_style" not in flags("gpt2", {})


def test_a_style_the_bundled_trainer_does_not_compute_skips_the_baseline_naming_it():
    with pytest.raises(BaselineUnmatched, match="--lr_decay_style=wsd: the bundled trainer "
                                                "computes none, constant, linear, cosine"):
        flags("llama3", {"lr_decay_style": "wsd"}, {**LR_LISTED, "learning_rate": "1e-5"})


# feat/support_moe's tiny_mixtral listing (example/tiny_mixtral/main.cc:24-35).
MIXTRAL_LISTED = {"micro_batch_size": "4", "global_batch_size": "4", "sequence_length": "64",
                  "num_iteration": "10", "learning_rate": "0.0001", "dtype": "float32"}


def test_tiny_mixtral_runs_the_mixtral_family_with_adam_and_its_batch_in_sequences():
    got = flags("tiny_mixtral", {"dtype": "float32", "num_iteration": 10,
                                 "global_batch_size": 80, "micro_batch_size": 20,
                                 "log_interval": 1}, MIXTRAL_LISTED)
    assert got == {"model": "mixtral", "dtype": "float32", "sequence_length": 64,
                   "num_iteration": 10, "learning_rate": 1e-4, "batch_size": 20,
                   "total_batch_size": 80 * 64, "optimizer": "adamw", "weight_decay": 0.0,
                   "adam_beta2": 0.999}
    default = flags("tiny_mixtral", {"dtype": "float32"}, MIXTRAL_LISTED)
    assert (default["batch_size"], default["total_batch_size"]) == (4, 256)
    with pytest.raises(BaselineUnmatched, match="--batch_size: no recorded counterpart .* "
                                                "tiny_mixtral"):
        flags("tiny_mixtral", {"batch_size": 4}, MIXTRAL_LISTED)


def test_every_fact_names_its_source_and_docs_table_them():
    assert all(f.source and f.baseline and f.subject for f in FACTS)
    doc = (Path(__file__).parents[2] / "docs" / "infinitrain_baseline.md").read_text()
    from harness.contracts.mixtral_facts import MIXTRAL_FACTS, fact_table as mixtral_table

    assert all(f.source and f.baseline and f.subject for f in MIXTRAL_FACTS)
    missing = [line for line in fact_table() + mixtral_table() if line not in doc]
    assert not missing, f"docs/infinitrain_baseline.md lacks the fact table's lines {missing[:2]}"
