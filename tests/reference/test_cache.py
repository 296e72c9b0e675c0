"""harness.reference.cache: a reference is built once per key, reused, and rebuilt when its
entry is corrupt or half-written; a failed build leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.reference import ReferenceCache, ReferenceError


def dump(folder: Path, arrays: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(value, np.float32))


def test_reference_cache_builds_once_reuses_and_rebuilds_corrupt(tmp_path):
    cache = ReferenceCache(tmp_path)
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "steps.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        dump(folder / "gradients", {"a": [1.0]})
        return {"command": ["x"]}

    key = {"model": "gpt2", "flags": {"a": 1}}
    first = cache.get_or_build(key, build)
    assert first.built and len(calls) == 1
    again = cache.get_or_build(key, build)
    assert not again.built and again.info == {"command": ["x"]} and len(calls) == 1
    np.save(first.gradients_dir / "a.npy", np.array([2.0], np.float32))  # corrupted content
    assert cache.get_or_build(key, build).built and len(calls) == 2
    (first.path / "COMPLETE.json").unlink()  # half-written entry: no marker
    assert cache.get_or_build(key, build).built and len(calls) == 3
    assert cache.get_or_build({"model": "gpt2", "flags": {"a": 2}}, build).built

    def failing(folder):
        raise ReferenceError("boom")

    with pytest.raises(ReferenceError):
        cache.get_or_build({"model": "llama3"}, failing)
    assert not any(p.name.startswith(".llama3") and "tmp" in p.name for p in tmp_path.iterdir())
    assert not any(p.name.startswith("llama3") for p in tmp_path.iterdir())
