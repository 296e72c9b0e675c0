"""The reference cache is keyed on everything a reference depends on (issue 48): a reference
that differs from a cached one in only its model, a model file's content, its flags, the device
or the trainer's version is a miss, is built again and is not served the cached entry; the same
reference again is a hit, and both entries are kept side by side.

Two ways in, both in process:
- reference_key -> ReferenceCache.get_or_build, part by part;
- CaseRunner.reference, where a case's key is made (its reference flags, its reference
  topology's process count, the parameter-updates flag, the device, the trainer's version),
  with a stand-in runner whose build writes a step file (no trainer is launched).

Planted by hand, each failing a test of this file (issue 48): every part left out of
reference_key (harness/reference/cache.py), out of key_digest, and at CaseRunner.reference's
call (harness/runner/case_runner.py) the device, the trainer's version, the world size and the
updates flag."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.reference import ReferenceCache, reference_key
from harness.runner.case_runner import CaseRunner

FLAGS = {"batch_size": 2, "sequence_length": 16, "dtype": "float32", "seed": 0}


def _files(tmp_path: Path) -> dict[str, Path]:
    """Model files: the base pair, a checkpoint and a token file of other content, and a copy of
    the base checkpoint at another path (a path is no part of the key: its content is)."""
    files = {"ckpt": b"checkpoint-a", "ckpt-other": b"checkpoint-b", "ckpt-copy": b"checkpoint-a",
             "tokens": b"tokens-a", "tokens-other": b"tokens-b"}
    for name, content in files.items():
        (tmp_path / f"{name}.bin").write_bytes(content)
    return {name: tmp_path / f"{name}.bin" for name in files}


def _key(files: dict[str, Path], model="gpt2", checkpoint="ckpt", input_bin="tokens",
         flags=FLAGS, device="cpu", trainer="harness-1") -> dict:
    return reference_key(model, {"checkpoint": files[checkpoint], "input_bin": files[input_bin]},
                         dict(flags), device, trainer)


# One part of the key changed (keyword -> value of `_key`), per part.
PARTS = {
    "model": {"model": "llama3"},
    "checkpoint-content": {"checkpoint": "ckpt-other"},
    "input-bin-content": {"input_bin": "tokens-other"},
    "flags-value": {"flags": {**FLAGS, "seed": 1}},
    "flags-added": {"flags": {**FLAGS, "learning_rate": 0.001}},
    "flags-removed": {"flags": {k: v for k, v in FLAGS.items() if k != "seed"}},
    "device": {"device": "cuda"},
    "trainer-version": {"trainer": "harness-2"},
}


class _Builds:
    """A build that writes a step file of its own number: an entry tells which build made it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, folder: Path) -> dict:
        self.count += 1
        (folder / "steps.jsonl").write_text(json.dumps({"step": 1, "loss": float(self.count)})
                                            + "\n")
        return {"build": self.count}


def _built_by(entry) -> int:
    return int(json.loads(entry.steps_file.read_text())["loss"])


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_reference_that_differs_in_one_part_of_the_key_is_a_miss(tmp_path, part):
    files = _files(tmp_path)
    cache, build = ReferenceCache(tmp_path / "refs"), _Builds()
    first = cache.get_or_build(_key(files), build)
    other = cache.get_or_build(_key(files, **PARTS[part]), build)
    assert first.built and other.built, f"{part}: the first reference was served for another " \
                                        f"{part}: the key leaves it out"
    assert build.count == 2 and other.path != first.path, part
    assert (_built_by(first), _built_by(other)) == (1, 2), part
    # both kept: each found again under its own key, neither rebuilt nor evicting the other
    for key, expected in ((_key(files), 1), (_key(files, **PARTS[part]), 2),
                          (_key(files), 1)):
        again = cache.get_or_build(key, build)
        assert not again.built and _built_by(again) == expected, part
        assert again.info == {"build": expected}, part
    assert build.count == 2, part


def test_the_same_reference_again_is_a_hit_even_with_its_files_elsewhere(tmp_path):
    files = _files(tmp_path)
    cache, build = ReferenceCache(tmp_path / "refs"), _Builds()
    first = cache.get_or_build(_key(files), build)
    # equal flags in another order, the checkpoint's content at another path: the same key
    again = cache.get_or_build(_key(files, checkpoint="ckpt-copy",
                                    flags=dict(reversed(list(FLAGS.items())))), build)
    assert first.built and not again.built and again.path == first.path
    assert build.count == 1


# ---------------------------------------------------------------- CaseRunner.reference's key

def _runner(tmp_path: Path, device="cpu", version="harness-1") -> tuple[SimpleNamespace, list]:
    """What CaseRunner.reference asks of its runner, standing in: the reference flags are the
    case's, the build writes one step (its loss: the build's number) and is trusted."""
    builds = []

    def run_target(folder: Path) -> Path:
        builds.append(folder)
        (folder / "steps.jsonl").write_text(json.dumps({"step": 1, "loss": float(len(builds))})
                                            + "\n")
        return folder

    runner = SimpleNamespace(
        settings=SimpleNamespace(device=device, golden_dir=None, golden_write_dir=None,
                                 session_dir=tmp_path / "session"),
        backend=SimpleNamespace(version=lambda: version),
        references=ReferenceCache(tmp_path / "refs"), progress=None,
        run_flags=lambda case, reference=False: dict(case.flags),
        updates_flag=lambda case: case.updates,
        plan_reference=lambda case, checkpoint, input_bin, folder: folder,
        run_target=run_target,
        judge_reference=lambda case, ran, flags, updates: None,
        settle_reference=lambda ran, problem, failure: {"build": len(builds)})
    return runner, builds


def _case(model="gpt2", flags=FLAGS, world=1, updates=None) -> SimpleNamespace:
    return SimpleNamespace(name=f"basic/{model}/pp2", model=model, flags=dict(flags),
                           reference_world_size=world, updates=updates,
                           reference_topology={"tensor_parallel": world} if world > 1 else {})


# One part of a case's reference changed: (runner keywords, case keywords, files), per part.
CASE_PARTS = {
    "model": ({}, {"model": "llama3"}, ("ckpt", "tokens")),
    "checkpoint-content": ({}, {}, ("ckpt-other", "tokens")),
    "input-bin-content": ({}, {}, ("ckpt", "tokens-other")),
    "reference-flags": ({}, {"flags": {**FLAGS, "dtype": "bfloat16"}}, ("ckpt", "tokens")),
    "reference-world-size": ({}, {"world": 2}, ("ckpt", "tokens")),
    "updates-flag": ({}, {"updates": "dump_parameter_updates"}, ("ckpt", "tokens")),
    "device": ({"device": "cuda"}, {}, ("ckpt", "tokens")),
    "trainer-version": ({"version": "harness-2"}, {}, ("ckpt", "tokens")),
}


@pytest.mark.parametrize("part", sorted(CASE_PARTS))
def test_a_cases_reference_that_differs_in_one_part_is_built_again(tmp_path, part):
    files = _files(tmp_path)
    runner_changes, case_changes, (checkpoint, input_bin) = CASE_PARTS[part]
    base, builds = _runner(tmp_path)
    first = CaseRunner.reference(base, _case(), files["ckpt"], files["tokens"]).entry
    other_runner, other_builds = _runner(tmp_path, **runner_changes)
    other = CaseRunner.reference(other_runner, _case(**case_changes), files[checkpoint],
                                 files[input_bin]).entry
    assert first.built and other.built, f"{part}: the first case's reference was served for " \
                                        f"another {part}: its key leaves it out"
    assert other.path != first.path and len(builds) == len(other_builds) == 1, part
    # and the first is still there, under its own key
    again = CaseRunner.reference(base, _case(), files["ckpt"], files["tokens"]).entry
    assert not again.built and again.path == first.path and len(builds) == 1, part


def test_the_same_cases_reference_again_is_a_hit(tmp_path):
    files = _files(tmp_path)
    runner, builds = _runner(tmp_path)
    case = _case(world=2, updates="dump_parameter_updates")
    first = CaseRunner.reference(runner, case, files["ckpt"], files["tokens"]).entry
    again = CaseRunner.reference(_runner(tmp_path)[0], _case(world=2,
                                 updates="dump_parameter_updates"),
                                 files["ckpt-copy"], files["tokens"]).entry
    assert first.built and not again.built and again.path == first.path and len(builds) == 1
    assert first.key["flags"]["reference_world_size"] == 2
