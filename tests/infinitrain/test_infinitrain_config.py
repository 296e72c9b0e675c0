"""InfiniTrain's own scripts/test_config.json, unchanged, run through the `infinitrain` backend
against the InfiniTrain stand-in (tests/infinitrain_standin): every case is compared or skipped
with a reason, and a difference planted in one parameter of the parallel runs is found and
located to its stage and layer.

`data/infinitrain_test_config.json` is InfiniTrain's public file, byte for byte (a test checks
it against ../shared/data where that copy exists).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.infinitrain_standin.build import make_build_dir
from tests.infinitrain_standin.model_files import micro_model_vars

HERE = Path(__file__).parent
CONFIG = HERE / "data" / "infinitrain_test_config.json"
SHARED = HERE.parents[2] / "shared" / "data" / "infinitrain_test_config.json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def infinitrain(tmp_path_factory):
    """A stand-in build folder (#209's flags, CUDA) and model files master's loaders accept
    (tests/infinitrain_standin/model_files.py), as --harness-var options. The stand-in
    computes the config's own batch sizes (5,120 tokens a step, up to 50 steps) in numpy."""
    root = tmp_path_factory.mktemp("infinitrain")
    build = make_build_dir(root / "build")
    return root, build, micro_model_vars(root)


def run_session(root: Path, build: Path, var_args: list[str], out: Path, *more: str,
                env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    (root / "pytest.ini").write_text("[pytest]\n")  # not the repository's testpaths / addopts
    argv = [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir",
            str(root), "-p", "no:cacheprovider", "-q", "--harness-config", str(CONFIG),
            "--harness-trainer", "infinitrain", "--infinitrain-build", str(build),
            "--gpus", "8", "--harness-output", str(out), *var_args, *more]
    result = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=1500,
                            env={**os.environ, **(env or {})})
    results = sorted(out.glob("sessions/*/results.jsonl"))
    records = [json.loads(line) for line in results[-1].read_text().splitlines()] \
        if results else []
    return result, records


def test_the_config_is_infinitrains_own_file():
    if not SHARED.is_file():
        pytest.skip(f"no shared copy at {SHARED} to check against")
    assert CONFIG.read_bytes() == SHARED.read_bytes()


# The warm session's cases: basic, ZeRO and LoRA cases on 1 and 8 ranks (TP 4 among them), and
# a checkpoint saved then resumed, for both models. Selected by the cases' own names
# (--harness-cases): -k would also match the folders above them, so a bare 1 or 4 selects
# every case of a checkout whose path holds that digit (issue 48: a clone in `baseline1/`).
WARM_SLICE = ("*/*/1,*/*/4,*/*/1_lora,*/*/4_lora,zero/*/3_zero2,zero/*/4_distopt,"
              "zero/*/4_zero2,checkpoint/*/ckpt_no_resume,checkpoint/*/ckpt_resume")


def _statuses(records: list[dict]) -> dict[str, tuple]:
    """What a session decided per case: status, and whether (and why not) gradients were
    compared."""
    def gradients(r):
        g = r.get("gradients") or {}
        return g.get("reason") if g.get("compared") is False else g.get("parameters")
    return {r["name"]: (r["status"], r.get("reason"), gradients(r)) for r in records}


def test_every_case_of_infinitrains_config_is_compared_or_skipped_with_a_reason(infinitrain):
    """The whole config, from a cold cache under -n 2, then again into the same output folder
    (a warm reference cache and binary facts, as every nightly after the first): the verdicts
    must not depend on cache state, case order or worker."""
    root, build, var_args = infinitrain
    # Two xdist workers, and 16 device slots so that both can hold an 8-device case at once
    # (threads mode runs a case as one process: the slots are only leases here).
    result, records = run_session(root, build, var_args, root / "all", "-n", "2",
                                  "--gpus", "16")
    output = result.stdout + result.stderr
    assert len(records) == 104, output[-3000:]
    by_status = Counter(r["status"] for r in records)
    assert by_status.get("failed", 0) == 0 and by_status.get("error", 0) == 0, \
        "\n\n".join(r["errors"][0] for r in records if r["errors"])[:6000]
    loss_only = [r for r in records if r["status"] == "passed"
                 and isinstance(r["gradients"], dict) and r["gradients"].get("compared") is False]
    with_gradients = [r for r in records if r["status"] == "passed" and r not in loss_only]
    skipped = [r for r in records if r["status"] == "skipped"]
    # Every passed case compared its losses at every expected step.
    for r in records:
        if r["status"] == "passed":
            assert r["loss"]["compared"] == len(r["losses"]) > 0, r["name"]
    # Gradients: GPT-2 dumps them (#209's --dump_gradients), under TP too (replicated files
    # whole, sharded ones against their TP slice); resumed runs dump nothing; LLaMA 3's
    # binary lists no --dump_gradients.
    assert all(r["model"] == "gpt2" and r["gradients"]["parameters"] > 0
               for r in with_gradients)
    reasons = Counter(r["gradients"]["reason"].split(":")[0].split(" (")[0] for r in loss_only)
    assert all(r["model"] == "llama3" or r["flags"].get("load") for r in loss_only)
    assert {r["name"] for r in with_gradients} >= {"basic/gpt2/6", "basic/gpt2/7",
                                                    "lora/gpt2/6_lora", "zero/gpt2/3_zero2"}
    tp = [r for r in with_gradients if int(r["flags"].get("tensor_parallel", 1)) > 1]
    assert len(tp) >= 20 and all(r["gradients"]["tp_slices"] > 0 for r in tp)
    # The resumed cases ran steps 31..50 and were compared on those, at their own steps.
    resumed = next(r for r in records if r["name"] == "checkpoint/gpt2/ckpt_resume")
    assert resumed["status"] == "passed" and len(resumed["losses"]) == 20
    assert resumed["steps"] == list(range(31, 51))
    assert not skipped, [(r["name"], r["reason"]) for r in skipped]
    print(f"\nInfiniTrain config on the stand-in: {len(with_gradients)} compared on loss and "
          f"gradients ({len(tp)} under TP), {len(loss_only)} on loss only ({dict(reasons)}), "
          f"{len(skipped)} skipped")

    # The second session: same output folder, warm cache (references and binary facts), the
    # same verdicts. It runs a slice of the config with every group, both models, one and many
    # ranks, TP, ZeRO, LoRA and a resume: the whole config's second session doubled this test's
    # time, and tests/reliability/test_idempotent.py runs three sessions per backend already.
    result, again = run_session(root, build, var_args, root / "all", "-n", "2", "--gpus", "16",
                                f"--harness-cases={WARM_SLICE}")
    assert len(list((root / "all").glob("sessions/*/results.jsonl"))) == 2
    first = _statuses(records)
    assert len(again) == 18 and {r["name"].split("/")[0] for r in again} == {
        "basic", "zero", "lora", "checkpoint"}, sorted(r["name"] for r in again)
    assert _statuses(again) == {name: first[name] for name in _statuses(again)}, \
        (result.stdout + result.stderr)[-3000:]
    assert all(r["reference"]["built"] is False for r in again if r["status"] == "passed")


# infini_run starts one process per device, each computing the stand-in's model: the 4-process
# case alone keeps that launch mode's run short.
@pytest.mark.parametrize("launch, cases", [("threads", "basic/gpt2/6,basic/gpt2/7"),
                                           ("infini_run", "basic/gpt2/7")])
def test_a_difference_planted_in_one_parameter_is_found_and_located(infinitrain, launch, cases):
    root, build, var_args = infinitrain
    result, records = run_session(
        root, build, var_args, root / f"planted-{launch}", f"--harness-cases={cases}",
        "--infinitrain-launch", launch,
        env={"STANDIN_PLANT": "transformer.h.5.mlp.c_fc.weight:1e-3"})
    output = result.stdout + result.stderr
    names = {r["name"]: r for r in records}
    expected = {"basic/gpt2/6", "basic/gpt2/7"} if launch == "threads" else {"basic/gpt2/7"}
    assert set(names) == expected, output[-3000:]
    for name, record in names.items():
        assert record["status"] == "failed", (name, output[-3000:])
        worst = record["gradients"]["worst"][0]
        assert worst["name"] == "transformer.h.5.mlp.c_fc.weight"
        assert worst["layer"] == "5"
    # PP 4 x VPP 2: chunk 5 of 8 is on stage 1; PP 8 over 8 layers: layer 5 is on stage 5.
    assert names["basic/gpt2/7"]["gradients"]["worst"][0]["stage"] == "1"
    assert "transformer.h.5.mlp.c_fc.weight" in output
    if launch == "threads":
        assert names["basic/gpt2/6"]["gradients"]["worst"][0]["stage"] == "5"
        assert "stage 5" in output


def test_a_crashing_rank_under_infini_run_is_a_crash_not_a_diff(infinitrain):
    """infini_run exits 0 whatever its children do: the fatal line and the missing steps make
    it a crash, with the rank and its log tail."""
    root, build, var_args = infinitrain
    result, records = run_session(
        root, build, var_args, root / "crash", "--infinitrain-launch", "infini_run",
        "-m", "basic", "-k", "gpt2/3 and not bfloat16",
        env={"STANDIN_CRASH_RANK": "1", "STANDIN_CRASH_STEP": "2"})
    output = result.stdout + result.stderr
    (record,) = records
    assert record["status"] == "failed" and record["returncode"] == 0, output[-3000:]
    assert record["failing_rank"] == "1"
    assert "a rank stopped on a fatal error: Check failed: planted crash on rank 1" in output
    assert "infini_run" in record["command"][0] and "--nproc_per_node=8" in record["command"]
    assert "gradients missing" not in output and "differs from" not in output


def _one_case_config(root: Path, args: dict) -> Path:
    data = json.loads(CONFIG.read_text())
    data["test_groups"] = [{"tag": "basic", "tests": [{"id": "bad", "args": args}]}]
    path = root / "one_case.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("args, env, expected", [
    ({"dtype": "float32", "my_new_flag": 3}, {},
     "the gpt2 binary ({build}/gpt2) does not accept --my_new_flag: not in its --helpxml "
     "flag listing, nor a flag the harness knows"),
    ({"dtype": "float32"}, {"STANDIN_NO_STEP_LINES": "1"},
     "the gpt2 binary exited 0 with 10 of 10 step lines missing (step 1, 2, 3, 4, 5, ...)"),
    # Refused by harness.layout before anything launches (the binary is never run).
    ({"nthread_per_process": 2, "pipeline_parallel": 2, "pipeline_layer_partition": "3,3"},
     {"STANDIN_CRASH_RANK": "0"},
     "basic/gpt2/bad: --pipeline_layer_partition '3,3': pipeline layer partition sums to 6 "
     "layers, but the model has 8 layers; expected entries summing to 8"),
])
def test_bad_inputs_give_one_clear_line_and_keep_the_case(infinitrain, args, env, expected):
    root, build, var_args = infinitrain
    config = _one_case_config(root, args)
    (root / "pytest.ini").write_text("[pytest]\n")
    out = root / f"bad-{'-'.join(sorted(args))}-{len(env)}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir",
         str(root), "-p", "no:cacheprovider", "-q", "--harness-config", str(config),
         "--infinitrain-build", str(build), "--gpus", "8", "--harness-output",
         str(out), *var_args, "-k", "gpt2"],
        cwd=root, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    output = result.stdout + result.stderr
    assert expected.format(build=build) in output, output[-3000:]
    (results,) = out.glob("sessions/*/results.jsonl")
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    # The reference (the same flags on one device) is the first run to meet the bad input.
    assert record["name"] == "basic/gpt2/bad" and record["status"] == "error"
    assert expected.format(build=build) in record["errors"][0]
    if "my_new_flag" in args:
        assert record["passthrough_flags"] == ["my_new_flag"]


def test_a_build_folder_without_the_binary_is_one_clear_line(infinitrain, tmp_path):
    root, _, var_args = infinitrain
    (root / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "empty").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir",
         str(root), "-p", "no:cacheprovider", "-q", "--harness-config", str(CONFIG),
         "--infinitrain-build", str(tmp_path / "empty"), "--gpus", "1", "--harness-output",
         str(tmp_path / "out"), *var_args, "-k", "basic and gpt2/1 and not bfloat16"],
        cwd=root, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert f"{tmp_path / 'empty'}: no `gpt2` binary in InfiniTrain's build folder" in output


def test_a_reference_topology_that_cannot_run_the_model_is_one_clear_line(infinitrain):
    """`"reference": {...}` names a trusted topology (for models one device cannot hold); one
    the trainer refuses for this model is an error naming the topology and the trainer's
    reason, never a pass."""
    root, build, var_args = infinitrain
    data = json.loads(CONFIG.read_text())
    data["test_groups"] = [{"tag": "basic", "reference": {"nthread_per_process": 8,
                                                          "tensor_parallel": 8},
                            "tests": [{"id": "pp2", "args": {"nthread_per_process": 2,
                                                             "pipeline_parallel": 2}}]}]
    config = root / "trusted.json"
    config.write_text(json.dumps(data))
    (root / "pytest.ini").write_text("[pytest]\n")
    out = root / "trusted"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir",
         str(root), "-p", "no:cacheprovider", "-q", "--harness-config", str(config),
         "--infinitrain-build", str(build), "--gpus", "8", "--harness-output", str(out),
         *var_args, "-k", "llama3"], cwd=root, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    (results,) = out.glob("sessions/*/results.jsonl")
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert record["status"] == "error", output[-3000:]
    assert ("the reference (nthread_per_process=8, tensor_parallel=8) failed: a rank stopped "
            "on a fatal error: Check failed: config.n_head % tp_world_size == 0 (4 vs. 0) n_head "
            "must be divisible by TP world size") in record["errors"][0]


def test_golden_records_replace_the_reference_and_say_where_they_came_from(infinitrain):
    """Record goldens in one session; check a later session against them without running a
    reference; a planted difference is still found; a golden from another environment and a
    missing golden are each one clear error."""
    root, build, var_args = infinitrain
    golden = root / "golden"
    select = ("-m", "basic", "-k", "gpt2/6 and not bfloat16")
    _, records = run_session(root, build, var_args, root / "g-write", *select,
                             "--harness-golden-write", str(golden))
    assert [r["status"] for r in records] == ["passed"]
    (entry,) = golden.iterdir()
    assert {p.name for p in entry.iterdir()} == {"golden.json", "steps.jsonl", "gradients"}

    _, records = run_session(root, build, var_args, root / "g-use", *select,
                             "--harness-golden", str(golden))
    (record,) = records
    assert record["status"] == "passed" and record["reference"]["golden"] == str(entry)
    assert record["reference"]["built"] is False and record["gradients"]["parameters"] > 0

    result, records = run_session(root, build, var_args, root / "g-planted", *select,
                                  "--harness-golden", str(golden),
                                  env={"STANDIN_PLANT": "transformer.h.5.mlp.c_fc.weight:1e-3"})
    assert records[0]["status"] == "failed"
    assert records[0]["gradients"]["worst"][0]["name"] == "transformer.h.5.mlp.c_fc.weight"

    meta = json.loads((entry / "golden.json").read_text())
    meta["fingerprint"]["device"] = "cuda"
    (entry / "golden.json").write_text(json.dumps(meta))
    result, records = run_session(root, build, var_args, root / "g-other", *select,
                                  "--harness-golden", str(golden))
    assert records[0]["status"] == "error"
    assert "was made in another environment: device 'cuda' then, 'cpu' now" in \
        records[0]["errors"][0]
    _, records = run_session(root, build, var_args, root / "g-allowed", *select,
                             "--harness-golden", str(golden), "--harness-golden-allow-mismatch")
    assert records[0]["status"] == "passed"
    assert records[0]["reference"]["golden_mismatch"] == {"device": ["cuda", "cpu"]}

    _, records = run_session(root, build, var_args, root / "g-missing",
                             "--harness-cases=basic/llama3/6", "--harness-golden", str(golden))
    assert records[0]["status"] == "error"  # no LLaMA 3 reference was recorded
    assert "basic/llama3/6: no golden record for its reference in" in records[0]["errors"][0]


def test_a_tp_reduction_bug_in_a_replicated_parameter_is_caught_and_located(infinitrain):
    """TP 4 x DP 2: a layer norm's gradient (whole on every TP rank) scaled by 1e-3 on every
    rank, as a missing or doubled TP / SP reduction would. The TP dump's replicated file is
    compared whole with the reference and names the parameter, its layer and stage."""
    root, build, var_args = infinitrain
    result, records = run_session(
        root, build, var_args, root / "planted-tp", "--harness-cases=basic/gpt2/4",
        env={"STANDIN_PLANT": "transformer.h.1.ln_1.weight:1e-3", "STANDIN_PLANT_RANKS": "all"})
    output = result.stdout + result.stderr
    (record,) = records
    assert record["status"] == "failed", output[-3000:]
    # The scale-free verdict finds it (the element-wise atol 1e-5 is above gradients this small)
    relative = record["gradients"]["relative"]
    assert relative["failed"] == ["transformer.h.1.ln_1.weight"]
    assert relative["worst_stage"] == "0" and relative["worst"] == pytest.approx(1e-3, rel=0.01)
    planted = next(w for w in record["gradients"]["worst"]
                   if w["name"] == "transformer.h.1.ln_1.weight")
    assert planted["layer"] == "1"
    assert "shard" not in planted  # compared whole: TP does not shard a layer norm
    assert record["gradients"]["tp_slices"] > 0  # the sharded files were compared by slice
    assert "transformer.h.1.ln_1.weight" in output


def test_a_signal_crash_is_named_with_the_binary_last_line(infinitrain):
    """A segfault (as bf16 on a CPU build) has nothing on stderr: the failure names SIGSEGV,
    blames the binary (not infini_run, which did not run) and shows glog's last line, which
    unbuffered glog (GLOG_logbuflevel=-1) has written."""
    root, build, var_args = infinitrain
    result, records = run_session(
        root, build, var_args, root / "segv", "-m", "basic", "-k", "gpt2/1 and not bfloat16",
        env={"STANDIN_CRASH_SIGNAL": "SEGV", "STANDIN_CRASH_STEP": "2"})
    output = result.stdout + result.stderr
    (record,) = records
    assert record["status"] == "error", output[-3000:]  # its reference (the same run) crashed
    text = record["errors"][0]
    assert "killed by signal SIGSEGV (exit code -11)" in text
    assert "the gpt2 binary stopped early: 9 of 10 step lines missing" in text
    assert "infini_run" not in text.splitlines()[0]
    assert "Rank 0: start forward" in text


def _run_plain(root: Path, config: Path, out: Path, *more: str) -> tuple[str, list[dict]]:
    """A session without --harness-trainer / --infinitrain-build: what the config alone says."""
    (root / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir", str(root),
         "-p", "no:cacheprovider", "-q", "--harness-config", str(config), "--gpus", "8",
         "--harness-output", str(out), *more], cwd=root, capture_output=True, text=True,
        timeout=600)
    results = sorted(out.glob("sessions/*/results.jsonl"))
    records = [json.loads(line) for line in results[-1].read_text().splitlines()] \
        if results else []
    return result.stdout + result.stderr, records


def test_infinitrains_config_alone_selects_its_binaries_or_says_what_to_pass(infinitrain):
    """A config with InfiniTrain's shape (a BUILD_DIR variable) runs InfiniTrain's binaries
    from BUILD_DIR, as its scripts do, and says so; where BUILD_DIR is no folder, every case is
    an error naming the options, never a silent run of the bundled trainer."""
    root, build, var_args = infinitrain
    scripts = root / "InfiniTrain" / "scripts"
    scripts.mkdir(parents=True)
    config = scripts / "test_config.json"
    config.write_bytes(CONFIG.read_bytes())  # BUILD_DIR ../build: InfiniTrain/build
    select = ["-m", "basic", "-k", "gpt2/1 and not bfloat16"]
    output, records = _run_plain(root, config, root / "plain-missing", *var_args, *select)
    (record,) = records
    assert record["status"] == "error", output[-3000:]
    assert record["errors"][0] == (
        f"basic/gpt2/1: variable BUILD_DIR {scripts / '..' / 'build'}: not a folder; expected InfiniTrain's build "
        f"folder (holding gpt2 and llama3); the config has InfiniTrain's shape, so its cases "
        f"run InfiniTrain's binaries: pass --infinitrain-build DIR, or --harness-trainer "
        f"harness for the bundled trainer")
    assert record["trainer"] == "infinitrain"

    make_build_dir(root / "InfiniTrain" / "build")
    output, records = _run_plain(root, config, root / "plain", *var_args, *select)
    (record,) = records
    assert (record["status"], record["trainer"]) == ("passed", "infinitrain"), output[-3000:]
    assert "trainer: infinitrain (infinitrain-" in output
    assert f"build {(root / 'InfiniTrain' / 'build').resolve()}), device cpu" in output
    (header,) = (root / "plain").glob("sessions/*/session.json")
    assert json.loads(header.read_text())["trainer"]["name"] == "infinitrain"


def test_a_build_folder_with_one_binary_loses_no_case(infinitrain, tmp_path):
    root, _, var_args = infinitrain
    only = make_build_dir(tmp_path / "only-gpt2", models=("gpt2",))
    result, records = run_session(root, only, var_args, tmp_path / "out",
                                  "--harness-cases=basic/*/1")
    by_name = {r["name"]: r for r in records}
    assert set(by_name) == {"basic/gpt2/1", "basic/llama3/1"}, result.stdout[-3000:]
    assert by_name["basic/gpt2/1"]["status"] == "passed"
    llama = by_name["basic/llama3/1"]
    assert llama["status"] == "error"
    assert llama["errors"][0].startswith(
        f"basic/llama3/1: InfiniTrainError: {only.resolve()}: no `llama3` binary in "
        f"InfiniTrain's build folder")
