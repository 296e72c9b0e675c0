"""harness.bisect.cache: a verdict is found again only under everything it depends on, and a
damaged or foreign file is no verdict."""

from __future__ import annotations

import json

from harness.bisect.cache import FORMAT, VerdictCache, default_dir, key

SHA = "a" * 40
ARGS = ["cases.json", "--gpus", "2"]


def test_the_key_depends_on_each_input_and_nothing_else():
    base = key(SHA, "make", ARGS, "t/gpt2/pp2", None)
    assert base == key(SHA, "make", list(ARGS), "t/gpt2/pp2", None)  # stable
    others = {
        key("b" * 40, "make", ARGS, "t/gpt2/pp2", None),
        key(SHA, "make -j2", ARGS, "t/gpt2/pp2", None),
        key(SHA, None, ARGS, "t/gpt2/pp2", None),
        key(SHA, "make", ARGS + ["--harness-baseline", "pytorch"], "t/gpt2/pp2", None),
        key(SHA, "make", ["--gpus", "2", "cases.json"], "t/gpt2/pp2", None),  # order counts
        key(SHA, "make", ARGS, "t/gpt2/pp2-vpp2", None),
        key(SHA, "make", ARGS, "t/gpt2/pp2", {"kind": "slower-than", "value": 1000.0}),
        key(SHA, "make", ARGS, "t/gpt2/pp2", {"kind": "slower-than", "value": 999.0}),
        key(SHA, "make", ARGS, "t/gpt2/pp2", {"kind": "memory-above", "value": 1000.0}),
    }
    assert base not in others and len(others) == 9


def test_a_verdict_round_trips_and_a_damaged_one_is_none(tmp_path):
    cache = VerdictCache(tmp_path)
    k = key(SHA, None, ARGS, "t/gpt2/pp2", None)
    assert cache.get(k) is None
    path = cache.put(k, {"outcome": "bad", "line": "t/gpt2/pp2: failed", "sha": SHA})
    assert path == tmp_path / "verdicts" / f"{k}.json"
    assert cache.get(k) == {"format": FORMAT, "key": k, "outcome": "bad",
                            "line": "t/gpt2/pp2: failed", "sha": SHA}
    assert list(path.parent.iterdir()) == [path]  # written whole, no scratch file left

    path.write_text(path.read_text()[:20])  # cut short
    assert cache.get(k) is None
    for entry in ({"format": "other/1", "key": k, "outcome": "bad"},
                  {"format": FORMAT, "key": "another", "outcome": "bad"},  # copied from elsewhere
                  {"format": FORMAT, "key": k, "outcome": "maybe"},
                  [1, 2]):
        path.write_text(json.dumps(entry))
        assert cache.get(k) is None, entry
    assert cache.run_dir(k) == tmp_path / "runs" / k[:16]


def test_the_default_folder_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "harness" / "bisect"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_dir() == tmp_path / "home" / ".cache" / "harness" / "bisect"
