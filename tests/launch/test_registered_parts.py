"""Launchers and trainer backends are registered parts (harness.registry): a toy launcher
(toy_launcher.py) and a toy trainer backend (toy_backend.py), each one file and one registry
line, run a case end to end (config load, reference, launch, collect, judge), and a failure is
read from the toy launcher's own record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import registry
from harness.cases import load_config
from harness.cases.config_types import TrainerSpec
from harness.launch.backends import registered_launcher
from harness.runner import CaseRunner, Settings
from harness.contracts.llmc.checkpoint import parameter_shapes, write_checkpoint
from harness.contracts.models import GPT2Config

pytestmark = pytest.mark.subprocess  # the toy launcher and its ranks are python processes

GPT2 = GPT2Config(block_size=4, vocab_size=8, n_layer=2, n_head=1, n_embd=2, padded_vocab_size=8)


@pytest.fixture
def toy_parts(monkeypatch):
    """The toy launcher and backend registered as docs/design.md says (one line each); the
    registry is as before once the test is done."""
    monkeypatch.setitem(registry.LAUNCHERS, "toy", "tests.launch.toy_launcher:ToyLauncher")
    monkeypatch.setitem(registry.TRAINER_BACKENDS, "toy",
                        "tests.launch.toy_backend:ToyBackend.from_config")


def _runner(folder: Path, tests: list[dict]) -> tuple[CaseRunner, dict]:
    write_checkpoint(folder / "gpt2.bin", GPT2, {
        name: np.zeros(shape, np.float32) for name, shape in parameter_shapes(GPT2).items()})
    (folder / "gpt2_tokens.bin").write_bytes(b"tokens" * 8)
    (folder / "cases.json").write_text(json.dumps({
        "models": ["gpt2"],
        "model_files": {"gpt2": {"checkpoint": "gpt2.bin", "input_bin": "gpt2_tokens.bin"}},
        "trainer": {"backend": "toy"},
        "defaults": {"num_iteration": 3, "batch_size": 1, "sequence_length": 4},
        "test_groups": [{"tag": "toy", "tests": tests}],
    }))
    config = load_config(folder / "cases.json")
    settings = Settings(session_id="s1", session_dir=folder / "session",
                        reference_root=folder / "references", lease_dir=folder / "leases",
                        slots=2, device="cpu", timeout_s=120, launcher="toy")
    return CaseRunner(config, settings), {c.case_id: c for c in config.cases}


def test_a_toy_backend_and_launcher_run_a_case_end_to_end(toy_parts, tmp_path):
    runner, cases = _runner(tmp_path, [{"id": "ok", "args": {"data_parallel": 2}}])
    assert type(runner.backend).__name__ == "ToyBackend"  # made by its registered factory
    outcome = runner.run(cases["ok"], nodeid="cases.json::toy/gpt2/ok")
    record = outcome.record
    assert outcome.status == "passed", outcome.message
    assert (record["trainer"], record["world_size"], record["returncode"]) == ("toy", 2, 0)
    # launched by the toy launcher (its command), its logs read in its own layout
    assert record["command"][1] == str(Path(__file__).with_name("toy_launcher.py"))
    logs = tmp_path / "session" / "cases" / "toy" / "gpt2" / "ok" / "logs"
    assert record["logs"]["ranks"] == {r: [str(logs / "toy-ranks" / f"rank{r}.log")]
                                       for r in ("0", "1")}
    # collected: every step and gradient compared with the reference (one toy rank)
    assert record["loss"]["compared"] == 3 and record["gradients"]["parameters"] == 3
    assert record["reference"]["command"][1].endswith("toy_launcher.py")


def test_a_failure_is_read_from_the_toy_launcher_s_own_record(toy_parts, tmp_path):
    """Rank 1 ends first; rank 0's log holds the only traceback (which a reading of the logs
    would blame), and there is no torchrun text nor zygote record: "1" can only come from
    toy-failure.json."""
    runner, cases = _runner(tmp_path, [{"id": "crash", "args": {"data_parallel": 2}}])
    outcome = runner.run(cases["crash"], nodeid="cases.json::toy/gpt2/crash")
    record = outcome.record
    assert outcome.status == "failed", outcome.message
    assert (record["returncode"], record["failing_rank"]) == (1, "1")
    logs = Path(record["logs"]["ranks"]["0"][0]).parent.parent
    assert json.loads((logs / "toy-failure.json").read_text()) == {"first_failed_rank": 1}
    assert "Traceback" in Path(record["logs"]["ranks"]["0"][0]).read_text()
    # pytest's failure text shows that rank's log, from the toy layout
    assert "rank 1 of 2 failed first" in outcome.message
    assert "toy-ranks/rank1.log" in outcome.message


def test_without_their_registry_lines_the_toy_parts_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"launcher 'toy' is not registered; expected one of "
                                         r"torchrun, zygote"):
        registered_launcher("toy")
    with pytest.raises(ValueError, match=r"backend is 'toy'; expected one of harness, command, "
                                         r"infinitrain"):
        TrainerSpec(backend="toy")


def test_the_registry_imports_no_launcher_backend_or_torch():
    code = ("import sys; import harness.registry as r; "
            "print(sorted(m for m in ('torch', 'harness.launch.zygote', "
            "'harness.launch.infinitrain') if m in sys.modules), r.launcher_names(), "
            "r.backend_names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "('torchrun',", "'zygote')", "('harness',", "'command',",
                                  "'infinitrain')"]
