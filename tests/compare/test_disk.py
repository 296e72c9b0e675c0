"""Bounded disk: dumps removed after the diff by policy; the reference cache's LRU bound."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from harness.compare.dumps import folder_bytes, settle_dumps
from harness.reference import ReferenceCache
from harness.reference.cache import LAST_USED, last_used
from harness.reference.prune import list_entries, main, prune


def make_dump(folder, n=100):
    folder.mkdir(parents=True)
    np.save(folder / "a.npy", np.ones(n, np.float32))
    return folder


@pytest.mark.parametrize("policy,passed,kept", [
    ("failed", True, False), ("failed", False, True), ("all", True, True), ("none", False, False)])
def test_dump_policy(tmp_path, policy, passed, kept):
    dump = make_dump(tmp_path / "gradients")
    size = folder_bytes(dump)
    entry = settle_dumps(dump, passed, policy)
    assert dump.is_dir() == kept
    assert entry == {"policy": policy, "kept": kept, "bytes": size,
                     "removed_bytes": 0 if kept else size}


def test_dump_policy_bad_name_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="keep-dumps"):
        settle_dumps(tmp_path, True, "some")
    assert settle_dumps(None, True)["bytes"] == 0


def build_entry(cache, model, size):
    def build(folder):
        (folder / "steps.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        make_dump(folder / "gradients", size)
        return {}
    return cache.get_or_build({"model": model}, build)


def test_lru_eviction_and_cli(tmp_path, capsys):
    cache = ReferenceCache(tmp_path)
    a = build_entry(cache, "a", 1000)
    b = build_entry(cache, "b", 1000)
    c = build_entry(cache, "c", 1000)
    t0 = time.time() - 10_000
    for i, entry in enumerate((b, a, c)):  # last use: b oldest, then a, then c
        (entry.path / LAST_USED).write_text(json.dumps({"last_used": t0 + i}))
    assert [e.name for e in list_entries(tmp_path)] == [b.path.name, a.path.name, c.path.name]
    build_entry(cache, "b", 1000)  # a use refreshes LAST_USED: b is now the newest
    assert last_used(b.path) > t0 + 100
    one = list_entries(tmp_path)[0].bytes
    evicted = prune(tmp_path, max_bytes=2 * one + 200)  # b is recent: protected anyway
    assert [e.name for e in evicted] == [a.path.name]
    assert not a.path.exists() and b.path.exists() and c.path.exists()
    assert main(["--root", str(tmp_path), "--list"]) == 0
    assert "2 entries" in capsys.readouterr().out
    assert main(["--root", str(tmp_path), "--max-gb", "0", "--min-idle-s", "0"]) == 0
    assert list_entries(tmp_path) == [] and "2 evicted" in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if "evicted" in p.name]


def test_dump_bytes_count_regular_files_only_and_the_policy_table(tmp_path):
    dump = tmp_path / "gradients"
    (dump / "sub").mkdir(parents=True)
    (dump / "a.npy").write_bytes(b"x" * 100)
    (dump / "sub" / "b.npy").write_bytes(b"y" * 28)
    (tmp_path / "outside.bin").write_bytes(b"z" * 5000)
    (dump / "link.npy").symlink_to(tmp_path / "outside.bin")  # not the dump's own bytes
    assert folder_bytes(dump) == 128 and folder_bytes(tmp_path / "nothing") == 0
    assert folder_bytes(None) == 0
    with pytest.raises(ValueError) as error:
        settle_dumps(dump, True, "some")
    assert str(error.value) == "keep-dumps is 'some'; expected one of failed, all, none"
    assert dump.is_dir()  # a bad policy removes nothing
    assert settle_dumps(dump, False, "all") == {"policy": "all", "kept": True, "bytes": 128,
                                                "removed_bytes": 0}
    assert settle_dumps(dump, True, "none") == {"policy": "none", "kept": False, "bytes": 128,
                                                "removed_bytes": 128}
    assert not dump.exists() and (tmp_path / "outside.bin").stat().st_size == 5000
    assert settle_dumps(None, False) == {"policy": "failed", "kept": False, "bytes": 0,
                                         "removed_bytes": 0}
