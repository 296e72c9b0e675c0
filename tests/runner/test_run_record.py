"""CaseRunner.run end to end in process, with the fake trainer (tests/plugin/fake_trainer.py) as
the launched program: every field of the result record that the run fills, and the verdict, for
each way a case goes (passed, failed on a diff, crashed, refused before launch, a trusted
reference topology, a resumed run, gradients a trainer cannot give, the bundled trainer's
parameter updates). These are what `results.jsonl`, the report and pytest's failure text are
made of; the mutation run (benchmarks/mutation.py) showed that nothing else pinned them."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cases import load_config
from harness.compare.verdict import update_threshold
from harness.launch import CommandBackend
from harness.runner import CaseRunner, Settings
from harness.contracts.llmc.checkpoint import parameter_shapes, write_checkpoint
from harness.contracts.models import GPT2Config
from tests.plugin.conftest import FAKE_TRAINER, fake_config

pytestmark = pytest.mark.subprocess  # every case launches the fake trainer

PP2 = {"pipeline_parallel": 2}
PP2_LAYOUT = [[0, 0, 4], [1, 4, 8]]  # 8 fake layers over two stages


class Foreign(CommandBackend):
    """The fake trainer as another project's trainer, with what a backend may add (InfiniTrain's
    does): from which step a run's losses count, which flags leave no comparable gradients, and
    a problem found in outputs although the run exited 0 (here: a FATAL log line)."""

    def first_step(self, flags: dict) -> int:
        return int(flags.get("first_step", 1))

    def gradients_unavailable(self, model: str, flags: dict) -> str | None:
        if int(flags.get("tensor_parallel", 1)) > 1:
            return f"not dumped by {model} under tensor parallelism"
        return None

    def collect(self, spec, result):
        outputs = super().collect(spec, result)
        fatal = self._fatal(result)
        if fatal:
            outputs.problem = f"a fatal log line: {fatal}"
        return outputs

    def failing_rank(self, spec, result):  # the rank a fatal line names, as InfiniTrain's
        match = re.search(r"rank (\d+):", self._fatal(result) or "")
        return match.group(1) if match else super().failing_rank(spec, result)

    @staticmethod
    def _fatal(result) -> str | None:
        lines = result.stdout.read_text().splitlines()
        return next((line for line in lines if line.startswith("FATAL")), None)


class Bundled(Foreign):
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
    {"id": "bad-grad-loss-only", "args": PP2, "compare": {"gradients": False}},
    {"id": "bad-loss-gradients-only", "args": PP2, "compare": {"loss": False}},
    {"id": "fatal-line", "args": PP2},
    # fp32's default atol (1e-5) is never looser than its scale-free 1e-5 x max(|loss|, 1): a
    # case that loosens the atol is still held to the scale-free threshold
    {"id": "scale-free-loss", "args": PP2, "tolerances": {"loss": {"atol": 1e-3}}},
    {"id": "own-updates-folder", "args": {"own_updates": 1}},
    # Checkpoint and resume: a resume case runs after its saver, or is skipped when it failed.
    {"id": "save", "args": {"save": "ck/a"}},
    {"id": "crash-save", "args": {"save": "ck/b"}},
    {"id": "resume", "args": {"load": "ck/a/checkpoint_step_000003"}},
    {"id": "resume-crashed", "args": {"load": "ck/b/checkpoint_step_000003"}},
]
ONE_DEVICE_CASES = [{"id": "exit-after-outputs", "args": {}}, {"id": "no-logs", "args": {}}]
TOPOLOGY_CASES = [{"id": "ok", "args": PP2}, {"id": "no-grads", "args": {"tensor_parallel": 2}}]
NO_REFERENCE_GRADS = [{"id": "ok", "args": {}}]
BUNDLED_CASES = [{"id": "ok", "args": PP2}, {"id": "bad-update", "args": PP2},
                 {"id": "no-grads", "args": {"tensor_parallel": 2}},
                 {"id": "rounding-update", "args": PP2},
                 {"id": "bad-grad", "args": PP2},
                 {"id": "small-update-diff", "args": {"dtype": "bfloat16", **PP2}},
                 {"id": "corrupt-update", "args": PP2}]
GOLDEN_CASES = [{"id": "ok", "args": PP2}]

# What a command template may name beyond the fake config's own: all of it reaches the run.
MORE_PLACEHOLDERS = ["--port", "{port}", "--checkpoint", "{checkpoint}", "--input_bin",
                     "{input_bin}", "--device", "{device}"]

# As deep as the fake trainer's model, so the harness knows the layers a layout places.
GPT2 = GPT2Config(block_size=4, vocab_size=8, n_layer=8, n_head=1, n_embd=2, padded_vocab_size=8)


def _runner(folder: Path, groups, backend_class, **settings) -> tuple[CaseRunner, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "gpt2.bin").is_file():
        write_checkpoint(folder / "gpt2.bin", GPT2, {
            name: np.zeros(shape, np.float32) for name, shape in parameter_shapes(GPT2).items()})
        (folder / "gpt2_tokens.bin").write_bytes(b"tokens" * 8)
    data = fake_config(None, groups=groups)
    (folder / "cases.json").write_text(json.dumps(data))
    config = load_config(folder / "cases.json")
    template = data["trainer"]["command"] + MORE_PLACEHOLDERS
    backend = backend_class(template, version="fake-1", base_dir=folder)
    settings = Settings(**{"session_id": "s1", "session_dir": folder / "session",
                           "reference_root": folder / "references", "lease_dir": folder / "leases",
                           "slots": 2, "device": "cpu", "timeout_s": 60, **settings})
    return CaseRunner(config, settings, backend=backend), {c.name: c for c in config.cases}


# Each folder's runner: its cases, its backend and its settings ("golden" made per root).
FOLDERS = {
    "foreign": ([{"tag": "fake", "tests": FOREIGN_CASES},
                 {"tag": "one", "tests": ONE_DEVICE_CASES},
                 {"tag": "topo", "reference": PP2, "tests": TOPOLOGY_CASES},
                 {"tag": "reftp", "reference": {"tensor_parallel": 2},
                  "tests": NO_REFERENCE_GRADS}], Foreign, {}),
    # "cuda": the device reaches the run (the fake trainer needs none)
    "bundled": ([{"tag": "fake", "tests": BUNDLED_CASES}], Bundled, {"device": "cuda"}),
    "bundled-keep-none": ([{"tag": "fake", "tests": [{"id": "bad-update", "args": PP2}]}],
                          Bundled, {"keep_dumps": "none"}),
    "golden-write": ([{"tag": "fake", "tests": GOLDEN_CASES}], Foreign,
                     {"golden_write_dir": "golden"}),
    "golden-read": ([{"tag": "fake", "tests": GOLDEN_CASES}], Foreign,
                    {"golden_dir": "golden", "golden_allow_mismatch": True, "keep_dumps": "all"}),
}
# What a case needs run before it: a resume its saver, a golden reader the golden writer.
BEFORE = {"foreign:fake/gpt2/resume": "foreign:fake/gpt2/save",
          "foreign:fake/gpt2/resume-crashed": "foreign:fake/gpt2/crash-save",
          "golden-read:fake/gpt2/ok": "golden-write:fake/gpt2/ok"}


class Runs:
    """`runs["folder:tag/model/id"]` -> (outcome, runner): the case run when first asked for,
    after what it needs (BEFORE), by its folder's runner, made when first needed. "gradients"
    in every path: a message about parameter updates must not rewrite paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runners: dict[str, tuple[CaseRunner, dict]] = {}
        self.done: dict[str, tuple] = {}

    def __getitem__(self, name: str) -> tuple:
        if name not in self.done:
            if name in BEFORE:
                self[BEFORE[name]]
            folder, case = name.split(":")
            runner, cases = self._runner(folder)
            self.done[name] = (runner.run(cases[case], nodeid=f"cases.json::{case}"), runner)
        return self.done[name]

    def _runner(self, folder: str) -> tuple[CaseRunner, dict]:
        if folder not in self.runners:
            groups, backend, settings = FOLDERS[folder]
            settings = {k: self.root / v if k.startswith("golden_") and k.endswith("dir") else v
                        for k, v in settings.items()}
            if folder == "golden-read":  # as if recorded on a GPU machine: accepted, and said
                for golden in (self.root / "golden").glob("*/golden.json"):
                    data = json.loads(golden.read_text())
                    data["fingerprint"]["device"] = "cuda"
                    golden.write_text(json.dumps(data))
            self.runners[folder] = _runner(self.root / folder, groups, backend, **settings)
        return self.runners[folder]


_SHARED: dict[str, Runs] = {}  # the module's runs, when tests share them


@pytest.fixture
def records(tmp_path_factory, tmp_path):
    """The cases a test asks for, run when it asks. Shared by the module's tests (about 30
    launches of the fake trainer, 10 s, once), except under mutmut: there every test runs its
    own cases in its own folder, because mutmut credits a call of the code under test to the
    test that was running when it happened, and runs a mutant against those tests only. A
    run shared with a later test would leave that test's checks out of every mutant's run."""
    if "MUTANT_UNDER_TEST" in os.environ:
        return Runs(tmp_path / "run-record-gradients")
    if "runs" not in _SHARED:
        _SHARED["runs"] = Runs(tmp_path_factory.mktemp("run-record-gradients"))
    return _SHARED["runs"]


@pytest.fixture(scope="module", autouse=True)
def _runs_of_this_module():
    # Per module run, not per interpreter: a process that ran this module before (mutmut's
    # forked workers) must not serve runs of other code.
    _SHARED.clear()
    yield
    _SHARED.clear()


def _value(command: list[str], option: str) -> str:
    """The item after `option` in an argv list (the template's `--name {placeholder}` pairs)."""
    return command[command.index(option) + 1]


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
    after = {a: record["command"][i + 1] for i, a in enumerate(record["command"][:-1])
             if a.startswith("--") and "=" not in a}
    assert after["--gradients_dir"] == str(out / "gradients")
    assert 1024 < int(after["--port"]) < 65536  # a free port, for the run's rendezvous
    # ... issued through the session's record, so no other case of the session gets it
    assert int(after["--port"]) in json.loads((session / "ports" / "ports.json").read_text())
    assert after["--checkpoint"] == str(runner.config.path.parent / "gpt2.bin")
    assert after["--input_bin"] == str(runner.config.path.parent / "gpt2_tokens.bin")
    assert (after["--device"], after["--model"], after["--world_size"]) == ("cpu", "gpt2", "2")
    assert (after["--output_dir"], after["--log_dir"]) == (str(out), str(out / "logs"))
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
    assert record["disk_bytes"] == sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
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
    assert _value(ref["command"], "--world_size") == "1"
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
    assert (record["gradients"]["ok"], record["gradients"]["parameters"]) == (True, 19)
    assert ref["built"] is True and ref["key"] != one_device["reference"]["key"]
    assert _value(ref["command"], "--world_size") == "2"
    assert "--pipeline_parallel=2" in ref["command"]


def test_a_mismatch_fails_with_the_parameter_stage_and_files(records):
    outcome, record, runner = _record(records, "foreign:fake/gpt2/bad-grad")
    assert outcome.status == "failed"
    out = runner.settings.session_dir / "cases" / "fake" / "gpt2" / "bad-grad"
    assert record["reason"] == outcome.message.splitlines()[0]
    assert record["errors"] == [outcome.message]
    text = outcome.message
    assert "h.5.attn.c_proj.weight" in text and "stage 1" in text
    assert f"\nrun folder: {out}\n" in text
    assert f"\nreference: {record['reference']['path']}\n" in text
    assert shlex.join(record["command"]) in text
    assert record["loss"]["ok"] is True
    grads = record["gradients"]
    assert (grads["ok"], grads["mismatched"]) == (False, 1)
    assert grads["worst"][0]["name"] == "h.5.attn.c_proj.weight"
    # GPT-2's tied embedding is placed on both ends: the model reaches the locator
    assert grads["per_layer"][0] == {"layer": "embedding", "stage": "0+1", "max_abs_diff": 0.0,
                                     "mismatched": 0, "parameters": 2}
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
    assert record["layout"]["chunks"] == PP2_LAYOUT  # no run.json: the one the flags ask for
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
    assert record["layout_text"] == "fake layout: stage 0 layers 0-2, stage 1 layers 3-7"
    assert record["parallel"]["schedule"] == "GPipe"
    assert record["layout"]["chunks"] == [[0, 0, 3], [1, 3, 8]]  # not the planned 4 + 4
    assert {w["name"]: w["stage"] for w in record["gradients"]["worst"]}[
        "h.3.mlp.c_fc.weight"] == "1"  # and the diff places layers by it


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
    assert _value(record["command"], "--gradients_dir") == ""
    assert record["loss"]["ok"] is True
    # The run's own reason stands, whatever its reference topology could give.
    outcome, record, _ = _record(records, "foreign:topo/gpt2/no-grads")
    assert outcome.status == "passed"
    assert record["gradients"] == {"compared": False,
                                   "reason": "not dumped by gpt2 under tensor parallelism"}
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
    # the updates went to the run's own folder, which the command says (not the flags: a
    # run's own path would keep every two records of one layout group apart)
    assert "dump_parameter_updates" not in record["flags"]
    assert f"--dump_parameter_updates={out / 'updates'}" in record["command"]
    assert record["device"] == "cuda"
    assert _value(record["command"], "--device") == "cuda"
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
    assert (updates["worst"][0]["name"], updates["worst"][0]["stage"]) == (
        "h.6.mlp.c_fc.weight", "1")
    assert updates["relative"]["threshold"] == update_threshold("float32")
    assert updates["per_layer"][0]["stage"] == "0+1"  # the tied embedding, as for gradients
    assert "parameter updates: mismatched 1 of 19 parameters" in outcome.message
    # ... after the loss's and the gradients' own lines
    assert "\n  loss: 3 of 3 steps within" in outcome.message
    assert "\n  gradients: 19 of 19 parameters within" in outcome.message
    assert "parameter updates" in outcome.message and "h.6.mlp.c_fc.weight" in outcome.message
    assert (out / "updates" / "h.6.mlp.c_fc.weight.npy").is_file()  # kept: the case failed


def test_what_a_case_does_not_compare_is_not_compared(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/bad-grad-loss-only")
    assert outcome.status == "passed"  # its planted gradient difference is not looked at
    assert record["gradients"] is None
    assert record["dumps"] == {"policy": "failed", "kept": False, "bytes": 0, "removed_bytes": 0}
    assert _value(record["command"], "--gradients_dir") == ""
    assert record["loss"]["ok"] is True
    outcome, record, _ = _record(records, "foreign:fake/gpt2/bad-loss-gradients-only")
    assert outcome.status == "passed"
    assert record["loss"] is None and record["gradients"]["ok"] is True
    assert record["losses"] == [4.875, 4.75, 4.635]  # recorded, though not compared
    assert record["reference_losses"] == [4.875, 4.75, 4.625]


def test_a_problem_the_backend_finds_fails_a_run_that_exited_0(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/fatal-line")
    assert outcome.status == "failed"
    assert record["returncode"] == 0
    assert record["reason"] == (
        "fake/gpt2/fatal-line: the run failed: rank 1 of 2 failed first; a fatal log line: "
        "FATAL fake: rank 1: planted fatal log line after the last step")
    assert record["failing_rank"] == "1"  # what the backend read in the run's output
    assert record["loss"] is None  # not diffed


def test_a_resume_case_runs_after_its_saver_and_is_skipped_when_it_failed(records):
    _, saved, runner = _record(records, "foreign:fake/gpt2/save")
    _, crashed, _ = _record(records, "foreign:fake/gpt2/crash-save")
    root = runner.settings.session_dir / "checkpoints" / "gpt2" / "ck"
    assert saved["flags"]["save"] == str(root / "a")  # moved under the session
    assert json.loads((root / "a" / ".harness-done.json").read_text()) == {"ok": True}
    assert json.loads((root / "b" / ".harness-done.json").read_text()) == {"ok": False}
    outcome, record, _ = _record(records, "foreign:fake/gpt2/resume")
    assert outcome.status == "passed", outcome.message
    assert record["flags"]["load"] == str(root / "a" / "checkpoint_step_000003")
    outcome, record, _ = _record(records, "foreign:fake/gpt2/resume-crashed")
    assert (outcome.status, record["status"]) == ("skipped", "skipped")
    assert record["reason"] == (f"resumes from {root / 'b' / 'checkpoint_step_000003'}, but the "
                                f"run that saves {root / 'b'} failed")
    assert record["command"] is None and record["errors"] == []


def test_a_golden_reference_from_another_environment_is_used_and_said(records):
    _, written, runner = _record(records, "golden-write:fake/gpt2/ok")
    assert written["reference"]["golden"] is None
    golden_root = runner.settings.golden_write_dir
    folders = [p for p in golden_root.iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1
    outcome, record, _ = _record(records, "golden-read:fake/gpt2/ok")
    assert outcome.status == "passed", outcome.message
    ref = record["reference"]
    assert (ref["golden"], ref["path"], ref["built"]) == (str(folders[0]), str(folders[0]), False)
    assert ref["golden_mismatch"] == {"device": ["cuda", "cpu"]}
    assert ref["key"] == written["reference"]["key"] and ref["command"] is None
    # --harness-keep-dumps all (this session's): a passing case's dumps stay too
    assert (record["dumps"]["policy"], record["dumps"]["kept"]) == ("all", True)
    assert (Path(record["output_dir"]) / "gradients" / "wte.weight.npy").is_file()


def test_no_parameter_updates_are_dumped_where_gradients_are_not_compared(records):
    outcome, record, _ = _record(records, "bundled:fake/gpt2/no-grads")
    assert outcome.status == "passed", outcome.message
    assert record["gradients"] == {"compared": False,
                                   "reason": "not dumped by gpt2 under tensor parallelism"}
    assert "dump_parameter_updates" not in record["flags"]
    assert not any("dump_parameter_updates" in a for a in record["command"])


def test_one_process_without_rank_logs_has_its_launcher_output_as_rank_0(records):
    outcome, record, runner = _record(records, "foreign:one/gpt2/no-logs")
    assert outcome.status == "passed", outcome.message
    logs = runner.settings.session_dir / "cases" / "one" / "gpt2" / "no-logs" / "logs"
    assert record["logs"]["ranks"] == {"0": [str(logs / "launcher.stdout"),
                                             str(logs / "launcher.stderr")]}


def test_a_loss_within_atol_but_over_the_scale_free_threshold_fails(records):
    outcome, record, _ = _record(records, "foreign:fake/gpt2/scale-free-loss")
    assert outcome.status == "failed"
    loss = record["loss"]
    assert (loss["elementwise_ok"], loss["relative"]["ok"], loss["ok"]) == (True, False, False)
    assert loss["relative"]["threshold"] == 1e-5 and loss["relative"]["worst_step"] == 2
    assert loss["relative"]["worst"] == pytest.approx(1e-4 / 4.75, rel=1e-6)
    assert "loss (scale-free): worst |got-ref|/max(|ref|,1)" in outcome.message


def test_a_foreign_trainers_own_updates_folder_is_not_taken_for_parameter_updates(records):
    outcome, record, runner = _record(records, "foreign:fake/gpt2/own-updates-folder")
    assert outcome.status == "passed", outcome.message
    assert (Path(record["reference"]["path"]) / "updates" / "junk.npy").is_file()
    assert "parameter_updates" not in record["gradients"]


def test_an_update_moved_by_float32_rounding_passes(records):
    outcome, record, _ = _record(records, "bundled:fake/gpt2/rounding-update")
    assert outcome.status == "passed", outcome.message
    updates = record["gradients"]["parameter_updates"]
    final_norm = next(p for p in updates["per_layer"] if p["layer"] == "final_norm")
    assert final_norm["max_abs_diff"] == pytest.approx(2.0**-23, rel=1e-3)  # it did move
    # ... by one step in an update of norm ~4e-6: a relative error of ~0.03 before the
    # resolution (UPDATE_RESOLUTION per element) takes rounding out
    assert updates["relative"]["ok"] is True


def test_updates_are_judged_after_the_gradients_not_instead(records):
    outcome, record, _ = _record(records, "bundled:fake/gpt2/bad-grad")
    assert outcome.status == "failed"
    assert record["gradients"]["ok"] is False
    assert record["gradients"]["parameter_updates"]["ok"] is True


def test_the_update_threshold_is_the_cases_dtypes(records):
    outcome, record, _ = _record(records, "bundled:fake/gpt2/small-update-diff")
    assert outcome.status == "passed", outcome.message  # 0.5 % is within bfloat16's 2e-2
    updates = record["gradients"]["parameter_updates"]
    assert updates["relative"]["threshold"] == update_threshold("bfloat16")
    assert 1e-3 < updates["relative"]["worst"] < 2e-2  # over float32's threshold, within bf16's


def test_an_unreadable_update_is_named_and_its_path_left_alone(records):
    outcome, record, runner = _record(records, "bundled:fake/gpt2/corrupt-update")
    assert outcome.status == "failed"
    path = (runner.settings.session_dir / "cases" / "fake" / "gpt2" / "corrupt-update" /
            "updates" / "h.3.mlp.c_fc.weight.npy")
    line = next(l for l in outcome.message.splitlines() if "cannot be read" in l)
    assert line.startswith("  parameter updates: h.3.mlp.c_fc.weight: the run's gradient file "
                           "cannot be read")
    assert "gradients" in str(path) and str(path) in line  # only the heading was renamed


def test_keep_dumps_none_removes_a_failed_cases_updates_too(records):
    outcome, record, _ = _record(records, "bundled-keep-none:fake/gpt2/bad-update")
    assert outcome.status == "failed"
    assert (record["dumps"]["policy"], record["dumps"]["kept"]) == ("none", False)
    out = Path(record["output_dir"])
    assert not (out / "gradients").exists() and not (out / "updates").exists()
