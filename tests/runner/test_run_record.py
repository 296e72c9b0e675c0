"""CaseRunner.run end to end in process, with the fake trainer (tests/plugin/fake_trainer.py) as
the launched program: every field of the result record that the run fills, and the verdict, for
each way a case goes (passed, failed on a diff, crashed, refused before launch, a trusted
reference topology, a resumed run, gradients a trainer cannot give, the bundled trainer's
parameter updates). These are what `results.jsonl`, the report and pytest's failure text are
made of; the mutation run (benchmarks/mutation.py) showed that nothing else pinned them."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cases import load_config
from harness.launch import CommandBackend
from harness.runner import CaseRunner, Settings
from harness.spec.llmc.checkpoint import parameter_shapes, write_checkpoint
from harness.spec.models import GPT2Config
from tests.plugin.conftest import FAKE_TRAINER, fake_config

pytestmark = pytest.mark.subprocess  # every case launches the fake trainer

PP2 = {"pipeline_parallel": 2}
PP2_LAYOUT = [[0, 0, 4], [1, 4, 8]]  # 8 fake layers over two stages


class Foreign(CommandBackend):
    """The fake trainer as another project's trainer, with the two questions a backend may
    answer (InfiniTrain's does): from which step a run's losses count, and which flags leave
    no comparable gradients."""

    def first_step(self, flags: dict) -> int:
        return int(flags.get("first_step", 1))

    def gradients_unavailable(self, model: str, flags: dict) -> str | None:
        if int(flags.get("tensor_parallel", 1)) > 1:
            return f"not dumped by {model} under tensor parallelism"
        return None


class Bundled(CommandBackend):
    """The fake trainer in the bundled trainer's place: resolved flags, parameter updates."""

    name = "harness"


FOREIGN_CASES = [
    {"id": "ok", "args": PP2},
    {"id": "bad-grad", "args": PP2},
    {"id": "crash", "args": PP2},
    {"id": "run-json", "args": PP2},
    {"id": "bad-partition", "args": {"pipeline_parallel": 2, "pipeline_layer_partition": "5,4"}},
    {"id": "from-step-2", "args": {"first_step": 2}},
    {"id": "bad-loss-from-step-2", "args": {"first_step": 2}},
    {"id": "no-grads", "args": {"tensor_parallel": 2}},
]
ONE_DEVICE_CASES = [{"id": "exit-after-outputs", "args": {}}]
TOPOLOGY_CASES = [{"id": "ok", "args": PP2}]
NO_REFERENCE_GRADS = [{"id": "ok", "args": {}}]
BUNDLED_CASES = [{"id": "ok", "args": PP2}, {"id": "bad-update", "args": PP2}]


# As deep as the fake trainer's model, so the harness knows the layers a layout places.
GPT2 = GPT2Config(block_size=4, vocab_size=8, n_layer=8, n_head=1, n_embd=2, padded_vocab_size=8)


def _runner(folder: Path, groups, backend_class) -> tuple[CaseRunner, dict]:
    folder.mkdir(parents=True)
    write_checkpoint(folder / "gpt2.bin", GPT2, {name: np.zeros(shape, np.float32)
                                                  for name, shape in parameter_shapes(GPT2).items()})
    (folder / "gpt2_tokens.bin").write_bytes(b"tokens" * 8)
    data = fake_config(None, groups=groups)
    (folder / "cases.json").write_text(json.dumps(data))
    config = load_config(folder / "cases.json")
    template = data["trainer"]["command"]
    backend = backend_class(template, version="fake-1", base_dir=folder)
    settings = Settings(session_id="s1", session_dir=folder / "session",
                        reference_root=folder / "references", lease_dir=folder / "leases",
                        slots=2, device="cpu", timeout_s=60)
    return CaseRunner(config, settings, backend=backend), {c.name: c for c in config.cases}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Every case run once (about 20 launches of the fake trainer); name -> (outcome, runner)."""
    root = tmp_path_factory.mktemp("run-record")
    found = {}
    for folder, groups, backend in (
        ("foreign", [{"tag": "fake", "tests": FOREIGN_CASES},
                     {"tag": "one", "tests": ONE_DEVICE_CASES},
                     {"tag": "topo", "reference": PP2, "tests": TOPOLOGY_CASES},
                     {"tag": "reftp", "reference": {"tensor_parallel": 2},
                      "tests": NO_REFERENCE_GRADS}], Foreign),
        ("bundled", [{"tag": "fake", "tests": BUNDLED_CASES}], Bundled),
    ):
        runner, cases = _runner(root / folder, groups, backend)
        for name, case in cases.items():
            found[f"{folder}:{name}"] = (runner.run(case, nodeid=f"cases.json::{name}"), runner)
    return found


def _record(records, name):
    outcome, runner = records[name]
    assert outcome.record["status"] == outcome.status
    return outcome, outcome.record, runner


def _timings_are_sane(record):
    t = record["timings"]
    assert set(t) == {"reference_s", "lease_wait_s", "run_s", "compare_s", "total_s"}, t
    parts = [t["reference_s"], t["lease_wait_s"], t["run_s"], t["compare_s"]]
    assert all(isinstance(v, float) and 0 <= v < 60 for v in parts), t
    assert t["run_s"] > 0.01  # a Python process that imports numpy
    assert sum(parts) <= t["total_s"] + 1e-6, t


def test_a_passing_case_has_every_field_of_its_run(records):
    outcome, record, runner = _record(records, "foreign:fake/gpt2/ok")
    assert (outcome.status, outcome.message, record["reason"], record["errors"]) == (
        "passed", "", None, [])
    session = runner.settings.session_dir
    out = session / "cases" / "fake" / "gpt2" / "ok"
    assert record["output_dir"] == str(out)
    # launched with its flags as written (the config's defaults and its own)
    assert record["flags"] == {"num_iteration": 3, "batch_size": 1, "sequence_length": 8,
                               "pipeline_parallel": 2}
    assert record["devices"] == [0, 1]
    assert record["command"][:3] == [sys.executable, str(FAKE_TRAINER), "--case"]
    assert record["command"][3] == "fake/gpt2/ok"
    assert "--pipeline_parallel=2" in record["command"]
    assert record["command"][record["command"].index("--gradients_dir") + 1] == str(
        out / "gradients")
    assert (record["returncode"], record["timed_out"], record["failing_rank"]) == (0, False, None)
    assert record["logs"] == {
        "launcher_stdout": str(out / "logs" / "launcher.stdout"),
        "launcher_stderr": str(out / "logs" / "launcher.stderr"),
        "ranks": {"0": [str(out / "logs" / "rank0.log")], "1": [str(out / "logs" / "rank1.log")]}}
    assert record["layout"]["chunks"] == [[0, 0, 4], [1, 4, 8]]  # from the run's run.json
    assert (record["environment"], record["layout_text"]) == (None, None)
    assert "schedule" not in record["parallel"]  # the run did not say
    assert record["losses"] == [4.875, 4.75, 4.625]
    assert record["reference_losses"] == [4.875, 4.75, 4.625]
    assert (record["tokens_per_s"], record["step_time_ms"], record["peak_memory_mb"]) == (
        2000.0, 1.0, 12.0)
    assert record["loss"]["ok"] is True and record["loss"]["steps"] == 3
    grads = record["gradients"]
    assert (grads["ok"], grads["parameters"], grads["mismatched"]) == (True, 19, 0)
    assert "parameter_updates" not in grads  # a foreign trainer dumps none
    assert record["dumps"] == {"policy": "failed", "kept": False, "bytes": 3344,
                               "removed_bytes": 3344}  # 19 arrays of 4 x 3 float32 in .npy
    assert not (out / "gradients").exists()  # a passing case's dumps are removed
    assert record["disk_bytes"] > 0
    _timings_are_sane(record)


def test_the_reference_is_built_once_per_key_and_recorded(records):
    _, first, runner = _record(records, "foreign:fake/gpt2/ok")
    _, second, _ = _record(records, "foreign:fake/gpt2/bad-grad")
    ref = first["reference"]
    assert ref["built"] is True and second["reference"]["built"] is False
    assert second["reference"]["key"] == ref["key"] and second["reference"]["path"] == ref["path"]
    assert ref["key"] and Path(ref["path"]).parent == runner.settings.reference_root
    assert (Path(ref["path"]) / "COMPLETE.json").is_file()
    # The reference's own command: case "reference", one process, no topology flag.
    assert ref["command"][:4] == [sys.executable, str(FAKE_TRAINER), "--case", "reference"]
    assert ref["command"][ref["command"].index("--world_size") + 1] == "1"
    assert not any(a.startswith("--pipeline_parallel") for a in ref["command"])
    assert second["reference"]["command"] == ref["command"]
    assert (ref["topology"], ref["golden"], ref["golden_mismatch"]) == (None, None, None)
    assert first["timings"]["reference_s"] > second["timings"]["reference_s"]  # built vs read


def test_a_trusted_reference_topology_is_its_own_key_and_named(records):
    _, one_device, _ = _record(records, "foreign:fake/gpt2/ok")
    outcome, record, _ = _record(records, "foreign:topo/gpt2/ok")
    assert outcome.status == "passed"
    ref = record["reference"]
    assert ref["topology"] == {"pipeline_parallel": 2}
    assert ref["built"] is True and ref["key"] != one_device["reference"]["key"]
    assert ref["command"][ref["command"].index("--world_size") + 1] == "2"
    assert "--pipeline_parallel=2" in ref["command"]


def test_a_mismatch_fails_with_the_parameter_stage_and_files(records):
    outcome, record, runner = _record(records, "foreign:fake/gpt2/bad-grad")
    assert outcome.status == "failed"
    out = runner.settings.session_dir / "cases" / "fake" / "gpt2" / "bad-grad"
    assert record["reason"] == outcome.message.splitlines()[0]
    assert record["errors"] == [outcome.message]
    text = outcome.message
    assert "h.5.attn.c_proj.weight" in text and "stage 1" in text
    assert str(out) in text and record["reference"]["path"] in text
    assert shlex.join(record["command"]) in text
    assert record["loss"]["ok"] is True
    grads = record["gradients"]
    assert (grads["ok"], grads["mismatched"]) == (False, 1)
    assert grads["worst"][0]["name"] == "h.5.attn.c_proj.weight"
    assert record["dumps"] == {"policy": "failed", "kept": True, "bytes": 3344,
                               "removed_bytes": 0}
    assert (out / "gradients" / "h.5.attn.c_proj.weight.npy").is_file()  # kept to look at


def test_a_crash_names_the_rank_and_diffs_nothing(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/crash")
    assert outcome.status == "failed"
    assert record["reason"] == "fake/gpt2/crash: the run failed: rank 1 of 2 failed first; exit code 3"
    assert "RuntimeError: planted crash on the last rank" in outcome.message
    assert (record["returncode"], record["failing_rank"]) == (3, "1")
    assert (record["loss"], record["gradients"], record["dumps"]) == (None, None, None)
    assert record["losses"] == [] and record["reference_losses"] is None
    assert "compare_s" not in record["timings"]  # nothing was compared


def test_a_one_process_failure_without_a_traceback_is_rank_0(records):
    outcome, record, _ = _record(records, "foreign:one/gpt2/exit-after-outputs")
    assert outcome.status == "failed"
    assert (record["returncode"], record["failing_rank"]) == (1, "0")
    assert record["reason"] == ("one/gpt2/exit-after-outputs: the run failed: rank 0 of 1 "
                                "failed first; exit code 1")
    assert record["loss"] is None  # complete outputs, but a failed run is not diffed


def test_what_the_run_says_of_itself_is_recorded(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/run-json")
    assert outcome.status == "passed"
    assert record["environment"] == {"trainer": "fake-1", "world_size": 2}
    assert record["layout_text"] == "fake layout over 2 stage(s)"
    assert record["parallel"]["schedule"] == "GPipe"
    assert record["layout"]["chunks"] == [[0, 0, 4], [1, 4, 8]]


def test_a_layout_a_foreign_trainer_would_get_wrong_is_refused_before_launch(records):
    outcome, record, runner = _record(records, "foreign:fake/gpt2/bad-partition")
    assert outcome.status == "error"
    assert record["reason"] == (
        "fake/gpt2/bad-partition: --pipeline_layer_partition '5,4': pipeline layer partition "
        "sums to 9 layers, but the model has 8 layers; expected entries summing to 8")
    assert record["errors"] == [outcome.message]
    assert (record["reference"], record["command"], record["output_dir"]) == (None, None, None)
    assert not (runner.settings.session_dir / "cases" / "fake" / "gpt2" / "bad-partition").exists()


def test_a_resumed_run_is_compared_from_its_first_step(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/from-step-2")
    assert outcome.status == "passed", outcome.message
    assert record["losses"] == [4.75, 4.625]
    assert record["reference_losses"] == [4.75, 4.625]  # step 1 of the reference left out
    outcome, record, _ = _record(records, "foreign:fake/gpt2/bad-loss-from-step-2")
    assert outcome.status == "failed"
    assert (record["loss"]["ok"], record["loss"]["mismatched_steps"]) == (False, [3])


def test_gradients_a_trainer_cannot_give_are_not_compared_and_say_why(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/no-grads")
    assert outcome.status == "passed"
    assert record["gradients"] == {"compared": False,
                                   "reason": "not dumped by gpt2 under tensor parallelism"}
    assert "--gradients_dir" in record["command"]
    assert record["command"][record["command"].index("--gradients_dir") + 1] == ""
    assert record["loss"]["ok"] is True
    outcome, record, _ = _record(records, "foreign:reftp/gpt2/ok")
    assert outcome.status == "passed"
    assert record["gradients"] == {
        "compared": False,
        "reason": "the reference topology's gradients are not dumped by gpt2 under tensor "
                  "parallelism"}


def test_the_bundled_trainer_also_compares_what_the_run_ends_with(records):
    outcome, record, runner = _record(records, "bundled:fake/gpt2/ok")
    assert outcome.status == "passed", outcome.message
    out = runner.settings.session_dir / "cases" / "fake" / "gpt2" / "ok"
    assert record["flags"]["dump_parameter_updates"] == str(out / "updates")
    updates = record["gradients"]["parameter_updates"]
    assert (updates["ok"], updates["parameters"], updates["mismatched"]) == (True, 19, 0)
    assert not (out / "updates").exists() and not (out / "gradients").exists()  # passed
    assert (Path(record["reference"]["path"]) / "updates" / "wte.weight.npy").is_file()

    outcome, record, runner = _record(records, "bundled:fake/gpt2/bad-update")
    assert outcome.status == "failed"
    out = runner.settings.session_dir / "cases" / "fake" / "gpt2" / "bad-update"
    assert record["gradients"]["ok"] is True  # the gradients match ...
    updates = record["gradients"]["parameter_updates"]  # ... what the step did does not
    assert (updates["ok"], updates["mismatched"]) == (False, 1)
    assert updates["worst"][0]["name"] == "h.6.mlp.c_fc.weight"
    assert "parameter updates" in outcome.message and "h.6.mlp.c_fc.weight" in outcome.message
    assert (out / "updates" / "h.6.mlp.c_fc.weight.npy").is_file()  # kept: the case failed
