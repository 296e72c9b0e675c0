"""Counts and sizes taken from input are bounded before anything is allocated from them (issue
15, item 5): `--pipeline_layer_costs 1x99999999999` used to raise MemoryError, a huge
--pipeline_parallel / --virtual_pipeline_parallel too, a profile record naming layer 10**9 built
a range of 10**9 ints, and --total_batch_size had no upper bound before the step's tokens were
stacked. Each is now one LayoutError / FlagError line naming the flag.

Every check runs under a 1 GiB address-space limit in a child process where the platform allows
it, so a regression fails as MemoryError instead of eating the shared machine's memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.layout import LayoutError, parse_costs, resolve_layout
from harness.layout.errors import MAX_COUNT
from harness.layout.profile import read_profile
from harness.contracts.flags import MAX_STEP_TOKENS, FlagError, microbatches


def bounded(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a child limited to 1 GiB of address space (RLIMIT_AS)."""
    prelude = ("import resource\n"
               "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n")
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kwargs, message", [
    ({"costs": "1x99999999999"},
     "--pipeline_layer_costs '1x99999999999': repeat count '99999999999' in '1x99999999999' "
     "makes more than 65536 layer costs; expected one cost per layer of the model"),
    ({"costs": "1x65536,1x1"},
     "--pipeline_layer_costs '1x65536,1x1': repeat count '1' in '1x1' makes more than 65536 "
     "layer costs; expected one cost per layer of the model"),
    ({"costs": "1x" + "9" * 5000}, "makes more than 65536 layer costs"),  # int() would refuse it
    ({"costs": "1x\u00b2"}, "repeat count '\u00b2' in '1x\u00b2' is not a positive integer"),
    ({"costs": "1x00"}, "repeat count '00' in '1x00' is not a positive integer"),
])
def test_cost_repeats_are_bounded_before_they_are_expanded(kwargs, message):
    with pytest.raises(LayoutError) as error:
        resolve_layout(8, 2, **kwargs)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_repeat_within_the_bound_still_says_the_layer_count():
    with pytest.raises(LayoutError, match=r"gives 9 layer costs, but the model has 8 layers"):
        parse_costs("1x9", 8)
    assert parse_costs("1x0008", 8).layers == (1.0,) * 8  # leading zeros: still 8


@pytest.mark.parametrize("pp, vpp, message", [
    (99999999999, 1, "--pipeline_parallel must be <= 65536, got 99999999999"),
    (2, 99999999999, "--virtual_pipeline_parallel must be <= 65536, got 99999999999"),
    (60000, 60000, "--pipeline_parallel 60000 x --virtual_pipeline_parallel 60000 = 3600000000 "
                   "pipeline chunks; expected at most 65536"),
])
@pytest.mark.parametrize("option", [{}, {"costs": "1x8"}, {"chunk_layout": "0:4,1:4"},
                                    {"megatron_layout": "Et*4|t*4NL"},
                                    {"partition": "4,4"}])
def test_stage_and_chunk_counts_are_bounded(pp, vpp, message, option):
    if option and vpp != 1 and ("costs" in option or "partition" in option):
        message = "must be <= 65536" if vpp > MAX_COUNT else "pipeline chunks"
    with pytest.raises(LayoutError) as error:
        resolve_layout(8, pp, vpp, **option)
    assert message in str(error.value)


def test_the_old_memory_errors_are_layout_errors_under_a_memory_limit():
    result = bounded("""
        from harness.layout import LayoutError, resolve_layout
        for kwargs in ({"costs": "1x99999999999"}, {"pp": 99999999999},
                       {"pp": 99999999999, "chunk_layout": "0:8"},
                       {"pp": 99999999999, "megatron_layout": "Et*8NL"},
                       {"vpp": 99999999999}):
            pp, vpp = kwargs.pop("pp", 2), kwargs.pop("vpp", 1)
            try:
                resolve_layout(8, pp, vpp, **kwargs)
            except LayoutError as error:
                print("refused:", error)
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("refused:") == 5
    assert "MemoryError" not in result.stderr


def test_a_profile_naming_a_huge_layer_is_refused(tmp_path):
    path = tmp_path / "profile.txt"  # InfiniTrain's text form
    path.write_text("TransformerLayer.0 cuda:0 10 20 1\n"
                    "TransformerLayer.1000000000 cuda:0 10 20 1\n")
    with pytest.raises(LayoutError) as error:
        read_profile([path], warmup_samples=0)
    assert str(error.value) == (f"{path}: a record names layer 1000000000; expected layers "
                                f"below 65536")


def test_the_step_size_is_bounded_before_its_tokens_are_stacked():
    assert microbatches(MAX_STEP_TOKENS, 1, 1, 1) == MAX_STEP_TOKENS
    with pytest.raises(FlagError) as error:
        microbatches(MAX_STEP_TOKENS + 1, 1, 1, 1)
    assert str(error.value) == (f"--total_batch_size={MAX_STEP_TOKENS + 1} tokens per step is "
                                f"more than {MAX_STEP_TOKENS} (2**28); expected a step a process "
                                f"can hold")


def test_the_trainer_refuses_a_huge_cost_repeat_with_one_line(tiny_assets, capsys):
    from harness.trainer import main as trainer_main

    code = trainer_main.main([f"--llmc_filepath={tiny_assets.checkpoint('gpt2')}",
                              f"--input_bin={tiny_assets.tokens('gpt2', 'train')}",
                              "--pipeline_parallel=2", "--pipeline_layer_costs=1x99999999999"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "error: --pipeline_layer_costs '1x99999999999': repeat count '99999999999' in "
        "'1x99999999999' makes more than 65536 layer costs; expected one cost per layer of the "
        "model"]
