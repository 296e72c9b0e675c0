"""`python -m harness.layout.suggest` for chunk layouts (vpp > 1) and memory budgets: the flag it
prints, the report, and one clear line for each bad input the issue names."""

import json

import pytest

from harness.layout import PipelineLayout
from harness.layout.profile import MEMORY_FORMAT, read_step_profile
from harness.layout.suggest import main

from .test_profile import record, write

MB = 2 ** 20


def profile_lines(pp=2, chunks=2, memory=True, steps=3, microbatches=4, head_ms=60.0, schedule="Interleaved1F1B"):
    """A run of 8 layers on `pp` ranks, round-robin chunks; times summed over the microbatches."""
    lines = []
    per_rank = {r: [i for i in range(8) if (i // (8 // (pp * chunks))) % pp == r] for r in range(pp)}
    for step in range(steps):
        for rank, layers in per_rank.items():
            keys = [*(["embedding"] if rank == 0 else []), *layers, *(["lm_head"] if rank == pp - 1 else [])]
            for key in keys:
                fwd, bwd = (head_ms, 2 * head_ms) if key == "lm_head" else (4.0, 8.0)
                extra = {"microbatches": microbatches, "chunk": 0, "chunks": chunks, "schedule": schedule}
                if memory:
                    extra |= {"activation_bytes": (8 if key == "lm_head" else 2) * MB,
                              "parameter_bytes": (16 if key in ("lm_head", "embedding") else 3) * MB}
                lines.append(record(key, fwd, bwd, step, rank, **extra))
            lines.append(json.dumps({"format": MEMORY_FORMAT, "step": step, "rank": rank,
                                     "peak_activation_bytes": 10 * MB, "parameter_bytes": 30 * MB,
                                     "gradient_bytes": 30 * MB, "optimizer_bytes": 60 * MB,
                                     "allocator_peak_bytes": None}))
    return lines


@pytest.fixture
def profile(tmp_path):
    return str(write(tmp_path, "layers.jsonl", profile_lines()))


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_reader_gives_per_microbatch_costs_memory_shape_and_measured_peaks(profile):
    p = read_step_profile([profile])
    assert p.microbatches == 4 and p.shape == (2, 2) and p.memory_missing is None
    assert p.costs.forward == (1.0,) * 8 and p.costs.backward == (2.0,) * 8
    assert p.costs.lm_head == (15.0, 30.0)
    assert p.costs.activation == (2 * MB,) * 8 and p.costs.lm_head_memory == (8 * MB, 16 * MB)
    assert p.stage_memory[1]["optimizer_bytes"] == 60 * MB


def test_vpp_prints_a_chunk_layout_the_trainer_accepts(profile, capsys):
    code, out, err = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                         "--profile", profile)
    assert code == 0 and out.count("\n") == 1 and out.startswith("--pipeline_chunk_layout=")
    layout = PipelineLayout.from_chunk_layout(8, 2, out.strip().split("=", 1)[1])
    assert layout.vpp == 2
    assert "predicted step" in err and "modeled speed-up" in err


def test_json_report_has_prediction_default_and_peaks(profile, capsys):
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", profile, "--optimizer", "adamw", "--json")
    report = json.loads(out)
    assert code == 0 and report["microbatches"] == 4
    assert report["default"]["chunk_layout"] == "0:2,1:2,0:2,1:2"
    assert report["default"]["schedule"] == "Interleaved1F1B"
    assert report["predicted_step_time"] < report["default"]["predicted_step_time"]
    assert len(report["stage_peaks_mb"]) == 2 and min(report["stage_peaks_mb"]) > 0


def test_budget_is_kept_or_refused_naming_stage_peak_and_budget(profile, capsys):
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", profile, "--optimizer", "adamw", "--json")
    free = json.loads(out)
    budget = max(free["stage_peaks_mb"]) - 1
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", profile, "--optimizer", "adamw", "--json", "--memory-budget-mb", str(budget))
    bound = json.loads(out)
    assert code == 0 and max(bound["stage_peaks_mb"]) <= budget
    assert bound["predicted_step_time"] >= free["predicted_step_time"]
    code, out, err = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                         "--profile", profile, "--memory-budget-mb", "20")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no layout fits --memory-budget-mb 20: the lowest modelled peak found is stage " in err
    assert " MB (layout " in err and "expected a budget of at least" in err


def test_front_lists_faster_layouts_with_higher_peaks(profile, capsys):
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", profile, "--optimizer", "adamw", "--front")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert code == 0 and len(rows) >= 2
    times, peaks = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
    assert times == sorted(times) and peaks == sorted(peaks, reverse=True)


@pytest.mark.parametrize("argv, lines, message", [
    # A vpp the schedule cannot run.
    (["--virtual-pipeline-parallel", "3", "--schedule", "ZBVZeroBubble"], None,
     "--schedule ZBVZeroBubble runs V-shaped chunks: --virtual-pipeline-parallel 2, but "
     "--virtual-pipeline-parallel is 3"),
    (["--virtual-pipeline-parallel", "2", "--schedule", "1F1B"], None,
     "--schedule 1F1B runs one chunk per stage: --virtual-pipeline-parallel 1, but"),
    (["--virtual-pipeline-parallel", "2", "--schedule", "Interleaved1F1B", "--microbatches", "5"], None,
     "Interleaved1F1B needs a microbatch count that is a multiple of max(1, microbatches // pp) = 2"),
    (["--virtual-pipeline-parallel", "2", "--schedule", "Zigzag"], None, "--schedule 'Zigzag' is not a schedule"),
    # A profile recorded with another shape.
    (["--virtual-pipeline-parallel", "2"], dict(pp=1, chunks=1),
     "the profile was recorded with --pipeline_parallel 1 --virtual_pipeline_parallel 1, but the "
     "suggestion is asked for --pipeline-parallel 2 --virtual-pipeline-parallel 2"),
    # A memory figure missing from an old profile, with a budget.
    (["--virtual-pipeline-parallel", "2", "--memory-budget-mb", "500"], dict(memory=False),
     "--memory-budget-mb 500: "),
    (["--virtual-pipeline-parallel", "0"], None, "--virtual-pipeline-parallel must be >= 1, got 0"),
    (["--virtual-pipeline-parallel", "2", "--memory-budget-mb", "-5"], None, "--memory-budget-mb must be > 0"),
])
def test_bad_input_is_one_line_naming_the_value(tmp_path, capsys, argv, lines, message):
    path = write(tmp_path, "p.jsonl", profile_lines(**(lines or {})))
    code, out, err = run(capsys, "--pipeline-parallel", "2", "--profile", str(path), *argv)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert message in err, err


def test_old_profile_without_memory_names_file_and_field_and_still_gives_times(tmp_path, capsys):
    path = write(tmp_path, "old.jsonl", profile_lines(memory=False))
    code, _, err = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", str(path), "--memory-budget-mb", "500")
    assert code == 2 and "old.jsonl: the record of layer 'embedding' (rank 0) has activation_bytes None" in err
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", str(path))
    assert code == 0 and out.startswith("--pipeline_chunk_layout=")


@pytest.mark.parametrize("vpp", ["1", "2"])
def test_a_zero_bubble_profile_is_refused_naming_file_and_schedule(tmp_path, capsys, vpp):
    # Its layer hooks saw the input pass of each backward, not the weight pass.
    path = write(tmp_path, "zbv.jsonl", profile_lines(schedule="ZBVZeroBubble"))
    ask = ["--pipeline-parallel", "2", "--virtual-pipeline-parallel", vpp, "--any-profile-shape"]
    code, out, err = run(capsys, *ask, "--profile", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "zbv.jsonl: recorded under the ZBVZeroBubble schedule" in err and "--pipeline_schedule GPipe" in err
    # The same records under a schedule with whole backwards are taken; the memory figures of
    # the refused profile can still be read (the benchmark compares them with the model).
    whole = write(tmp_path, "gpipe.jsonl", profile_lines(schedule="GPipe"))
    assert run(capsys, *ask, "--profile", str(whole))[0] == 0
    assert read_step_profile([path]).stage_memory[0]["peak_activation_bytes"] == 10 * MB


def test_other_shape_is_accepted_when_asked(tmp_path, capsys):
    path = write(tmp_path, "p.jsonl", profile_lines(pp=1, chunks=1))
    code, out, _ = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--profile", str(path), "--any-profile-shape")
    assert code == 0 and out.startswith("--pipeline_chunk_layout=")
    code, _, err = run(capsys, "--pipeline-parallel", "2", "--profile", str(path))
    assert code == 2 and "recorded with --pipeline_parallel 1" in err


def test_costs_with_a_budget_is_refused(capsys):
    code, _, err = run(capsys, "--pipeline-parallel", "2", "--virtual-pipeline-parallel", "2",
                       "--costs", "1x8,L:6", "--memory-budget-mb", "100")
    assert code == 2 and "needs per-layer memory figures, which --costs '1x8,L:6' does not give" in err
