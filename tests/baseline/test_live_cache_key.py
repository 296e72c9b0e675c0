"""The live PyTorch baseline's cache (`<reference cache>/baselines/`) is keyed on everything a
baseline run depends on (issue 48): a check that differs from a cached one in only its model, a
model file's content, the baseline flags, whether the baseline dumps gradients, the device or
the bundled trainer's version runs the baseline again and is not judged on the cached run; the
same check again reuses it. Through LiveBaseline.check, its run faked in process (each run's
losses are its own, so a check judged on another run's losses is told).

Planted by hand, each failing a test of this file (issue 48): every part left out of the key
LiveBaseline.check makes (harness/baseline/live.py): the model, the checkpoint, the input_bin,
the flags, the dump_gradients flag, the device, the trainer's version."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.baseline.gradients import GradientRequest
from harness.baseline.live import LiveBaseline
from harness.contracts.tolerance import Tolerance

FLAGS = {"dtype": "float32", "num_iteration": 2, "optimizer": "sgd"}


class _Subject:
    def __init__(self, flags=FLAGS) -> None:
        self.flags = dict(flags)

    def baseline_flags(self, model, args):
        return {"model": model, **self.flags}  # the family is the program's own here


class _Runs:
    """The baseline's runs, faked: run N records the losses (N, N - 0.5); asked for gradients,
    it dumps one."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, backend, name, model, flags, checkpoint, input_bin, folder, gradients):
        self.calls.append((model, dict(flags), gradients))
        n = float(len(self.calls))
        if gradients:
            (folder / "gradients").mkdir(parents=True, exist_ok=True)
            np.save(folder / "gradients" / "wte.weight.npy", np.ones(2, np.float32))
        result = SimpleNamespace(argv=["python", "-m", "harness.trainer", str(n)],
                                 duration_s=0.1, returncode=0, stderr="log")
        outputs = SimpleNamespace(steps=[{"step": 1, "loss": n, "lr": 1e-4},
                                         {"step": 2, "loss": n - 0.5, "lr": 1e-4}],
                                  problem=None)
        return SimpleNamespace(launched=SimpleNamespace(result=result), outputs=outputs,
                               failed=False)


def _live(tmp_path: Path, runs: _Runs, device="cpu", version="harness-1") -> LiveBaseline:
    live = LiveBaseline(SimpleNamespace(reference_root=tmp_path / "refs", device=device), runs)
    live.backend = SimpleNamespace(version=lambda: version)  # the bundled trainer's version
    return live


def _files(tmp_path: Path) -> dict[str, Path]:
    """The base pair, a checkpoint and tokens of other content, the base checkpoint's content
    at another path (the key holds content, not paths)."""
    files = {"ckpt": b"checkpoint-a", "ckpt-other": b"checkpoint-b", "ckpt-copy": b"checkpoint-a",
             "tokens": b"tokens-a", "tokens-other": b"tokens-b"}
    for name, content in files.items():
        (tmp_path / f"{name}.bin").write_bytes(content)
    return {name: tmp_path / f"{name}.bin" for name in files}


RUN_STEPS = [{"step": 1, "loss": 1.0, "lr": 1e-4},  # equal to run 1's
             {"step": 2, "loss": 0.5, "lr": 1e-4}]


def _check(tmp_path, runs, files, *, model="llama3", checkpoint="ckpt", input_bin="tokens",
           flags=FLAGS, dumps=False, device="cpu", version="harness-1"):
    # llama3: no gradient naming recorded, so a dumping check is judged on its losses alone
    request = GradientRequest(tmp_path / "run", tmp_path / "case" / "bg", Tolerance(1e-5),
                              1e-5) if dumps else None
    return _live(tmp_path, runs, device, version).check(
        _Subject(flags), model, f"basic/{model}/1", {}, RUN_STEPS, files[checkpoint],
        files[input_bin], 1, request, None if dumps else "not dumped")


PARTS = {
    "model": {"model": "gpt2"},
    "checkpoint-content": {"checkpoint": "ckpt-other"},
    "input-bin-content": {"input_bin": "tokens-other"},
    "flags-value": {"flags": {**FLAGS, "optimizer": "adamw"}},
    "flags-added": {"flags": {**FLAGS, "learning_rate": 0.001}},
    "dumps-gradients": {"dumps": True},
    "device": {"device": "cuda"},
    "trainer-version": {"version": "harness-2"},
}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_baseline_that_differs_in_one_part_of_the_key_is_run_again(tmp_path, part):
    files, runs = _files(tmp_path), _Runs()
    first = _check(tmp_path, runs, files)
    assert first.status == "passed" and first.run["built"] and first.losses == (1.0, 0.5)
    other = _check(tmp_path, runs, files, **PARTS[part])
    assert other.run["built"], f"{part}: the first baseline run was reused for another " \
                               f"{part} (judged on {other.losses}): the key leaves it out"
    assert len(runs.calls) == 2 and other.run["key"] != first.run["key"], part
    assert other.losses == (2.0, 1.5) and other.status == "failed", part
    # both kept: each check finds its own run again
    for changes, losses in (({}, (1.0, 0.5)), (PARTS[part], (2.0, 1.5)), ({}, (1.0, 0.5))):
        again = _check(tmp_path, runs, files, **changes)
        assert not again.run["built"] and again.losses == losses, part
    assert len(runs.calls) == 2, part


def test_the_same_baseline_again_is_reused(tmp_path):
    files, runs = _files(tmp_path), _Runs()
    first = _check(tmp_path, runs, files, dumps=True)
    again = _check(tmp_path, runs, files, checkpoint="ckpt-copy",
                   flags=dict(reversed(list(FLAGS.items()))), dumps=True)
    assert first.run["built"] and not again.run["built"]
    assert again.run["key"] == first.run["key"] and len(runs.calls) == 1
    assert runs.calls == [("llama3", FLAGS, True)]
