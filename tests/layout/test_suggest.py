import contextlib
import io
import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.layout import LayerCosts, PipelineLayout
from harness.layout.suggest import main

from .strategies import cost_problems
from .test_profile import record, write


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "harness.layout.suggest", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_prints_the_flag_alone_on_stdout():
    proc = run_cli("--pipeline-parallel", "2", "--costs", "1x8,L:4.5")
    assert proc.returncode == 0
    assert proc.stdout == "--pipeline_layer_partition=6,2\n"
    assert "slowest 6.5" in proc.stderr and "uniform 4,4" in proc.stderr


def test_cli_error_is_one_line_with_exit_code_2():
    proc = run_cli("--pipeline-parallel", "2", "--costs", "1x8,L:nan")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("python -m harness.layout.suggest: error: --pipeline_layer_costs '1x8,L:nan'")


def test_json_report(capsys):
    assert main(["--pipeline_parallel", "2", "--costs", "1x8,L:4.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partition"] == [6, 2]
    assert report["flag"] == "--pipeline_layer_partition=6,2"
    assert report["stage_costs"] == [6.0, 6.5]
    assert report["slowest_stage"] == {"stage": 1, "cost": 6.5}
    assert report["uniform"] == {"partition": [4, 4], "stage_costs": [4.0, 8.5],
                                 "slowest_stage": {"stage": 1, "cost": 8.5}}
    assert abs(report["modeled_improvement"]["speedup"] - 8.5 / 6.5) < 1e-12


def test_seed_examples_through_the_tool(capsys):
    for spec, expected in [("10,1,1,1,1,1", "1,5"), ("1x8,L:10.9", "7,1")]:
        assert main(["--pipeline-parallel", "2", "--costs", spec]) == 0
        assert capsys.readouterr().out == f"--pipeline_layer_partition={expected}\n"


def test_profile_input_with_overrides(tmp_path, capsys):
    lines = [record(i, 1.0, 1.0, step) for step in range(3) for i in range(8)]
    lines += [record("lm_head", 50.0, 50.0, step) for step in range(3)]
    path = write(tmp_path, "layers.jsonl", lines)
    assert main(["--pipeline-parallel", "2", "--profile", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["costs"]["lm_head"] == 100.0 and report["partition"] == [7, 1]
    assert main(["--pipeline-parallel", "2", "--profile", str(path), "--lm-head-cost", "9"]) == 0
    assert capsys.readouterr().out == "--pipeline_layer_partition=6,2\n"


def test_usage_errors(tmp_path, capsys):
    cases = [
        (["--costs", "1x4"], "the following arguments are required: --pipeline-parallel"),
        (["--pipeline-parallel", "2"], "one of the arguments --costs --profile is required"),
        (["--pipeline-parallel", "2", "--costs", "1", "--profile", "x"], "not allowed with argument"),
        (["--pipeline-parallel", "0", "--costs", "1"], "--pipeline-parallel must be >= 1, got 0"),
        (["--pipeline-parallel", "two", "--costs", "1"], "invalid int value: 'two'"),
        (["--pipeline-parallel", "3", "--costs", "1,1"], "gives 2 layer costs, but --pipeline_parallel is 3"),
        (["--pipeline-parallel", "2", "--costs", "1x4,E:1", "--embedding-cost", "2"], "both set it"),
        (["--pipeline-parallel", "2", "--profile", str(tmp_path / "none.jsonl")], "none.jsonl: cannot read profile"),
        (["--pipeline-parallel", "2", "--profile", "p", "--warmup-samples", "-1"], "--warmup-samples must be >= 0"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@settings(max_examples=60, deadline=None)
@given(cost_problems(max_layers=12, max_stages=5), st.booleans())
def test_tool_agrees_with_from_costs(problem, as_flags):
    costs, pp, e, l = problem
    spec = LayerCosts(tuple(costs), e, l).to_spec()
    argv = ["--pipeline-parallel", str(pp), "--json"]
    if as_flags:
        argv += ["--costs", LayerCosts(tuple(costs)).to_spec(), "--embedding-cost", repr(e), "--lm-head-cost", repr(l)]
    else:
        argv += ["--costs", spec]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    expected = PipelineLayout.from_costs(len(costs), pp, spec).stage_layer_counts()
    assert tuple(json.loads(out.getvalue())["partition"]) == expected


def test_the_name_given_to_the_trainer_stands_for_its_per_rank_files(tmp_path, capsys):
    """Under torchrun `--profile_layers layers.jsonl` writes layers.rank<r>.jsonl; the tool takes
    the name as one argument (and reads the ranks in rank order, 10 after 2)."""
    from harness.layout.suggest import expand_profiles

    for rank, layers in ((0, range(0, 4)), (1, range(4, 8))):
        write(tmp_path, f"layers.rank{rank}.jsonl",
              [record(i, 1.0, 1.0, step) for step in range(3) for i in layers]
              + ([record("lm_head", 50.0, 50.0, step) for step in range(3)] if rank else []))
    (tmp_path / "layers.rank10.jsonl").write_text("")
    (tmp_path / "layers.rankx.jsonl").write_text("")  # not a rank file
    named = str(tmp_path / "layers.jsonl")
    assert expand_profiles([named]) == [str(tmp_path / f"layers.rank{r}.jsonl") for r in (0, 1, 10)]
    (tmp_path / "layers.rank10.jsonl").unlink()
    assert main(["--pipeline-parallel", "2", "--profile", named, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partition"] == [7, 1]
    missing = str(tmp_path / "none.jsonl")
    assert expand_profiles([missing]) == [missing]  # the reader's own error names it
