"""`--harness-slurm-args` takes one word that starts with "--" as well as several."""

from __future__ import annotations

from harness.runner.settings import join_option_value


def test_option_value_pairs_are_joined_and_nothing_else():
    assert join_option_value(["-q", "--harness-slurm-args", "--partition=x", "-n", "2"],
                             "--harness-slurm-args") == \
        ["-q", "--harness-slurm-args=--partition=x", "-n", "2"]
    assert join_option_value(["--harness-slurm-args=--qos=y", "--", "--harness-slurm-args", "z"],
                             "--harness-slurm-args") == \
        ["--harness-slurm-args=--qos=y", "--", "--harness-slurm-args", "z"]


def test_one_word_reaches_the_session(pytester):
    given, value = ["--harness-slurm-args", "--partition=x"], "--partition=x"
    pytester.makepyfile(test_a="""
        def test_value(pytestconfig):
            print("VALUE", repr(pytestconfig.getoption("--harness-slurm-args")))
        """)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "test_a.py", *given)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*VALUE {value!r}"])
