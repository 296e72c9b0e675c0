"""Golden records: keyed without the trainer, checked on the environment, copied atomically."""

import json

import pytest

from harness.reference import ReferenceEntry, ReferenceError
from harness.reference.golden import (
    GoldenStore,
    fingerprint_mismatch_text,
    golden_key,
    mismatches,
)

KEY = {"model": "gpt2", "files": {"checkpoint": "ab"}, "flags": {"dtype": "float32"},
       "device": "cpu", "trainer": "infinitrain-1234"}
FP = {"trainer": "infinitrain-1234", "device": "cpu", "torch": None, "gpu": None,
      "driver": None}


def reference(tmp_path):
    (tmp_path / "ref" / "gradients").mkdir(parents=True)
    (tmp_path / "ref" / "steps.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    (tmp_path / "ref" / "gradients" / "w.npy").write_bytes(b"npy")
    return ReferenceEntry(tmp_path / "ref", KEY, built=True, info={})


def test_a_golden_is_found_by_a_key_without_the_trainer(tmp_path):
    store = GoldenStore(tmp_path / "golden")
    folder = store.write(KEY, reference(tmp_path), FP)
    assert "trainer" not in golden_key(KEY)
    rebuilt = {**KEY, "trainer": "infinitrain-5678"}  # a new build checks against the old one
    golden = store.read(rebuilt, "basic/gpt2/6")
    assert golden.entry.path == folder and golden.fingerprint == FP
    assert golden.entry.steps_file.read_text() == '{"step": 1, "loss": 5.0}\n'
    assert (golden.entry.gradients_dir / "w.npy").read_bytes() == b"npy"
    assert not [p for p in (tmp_path / "golden").iterdir() if p.name.startswith(".")]


def test_missing_and_foreign_goldens_are_errors_naming_the_case(tmp_path):
    store = GoldenStore(tmp_path / "golden")
    with pytest.raises(ReferenceError, match=r"^basic/gpt2/6: no golden record for its "
                       r"reference in .*golden \(looked for gpt2-"):
        store.read(KEY, "basic/gpt2/6")
    folder = store.write(KEY, reference(tmp_path), FP)
    meta = json.loads((folder / "golden.json").read_text())
    meta["key"]["flags"] = {"dtype": "bfloat16"}
    (folder / "golden.json").write_text(json.dumps(meta))
    with pytest.raises(ReferenceError, match="is not for this reference"):
        store.read(KEY, "basic/gpt2/6")


def test_only_the_environment_must_match_not_the_trainer():
    now = {**FP, "trainer": "other", "device": "cuda", "gpu": "NVIDIA H200"}
    found = mismatches(FP, now)
    assert found == {"device": ("cpu", "cuda"), "gpu": (None, "NVIDIA H200")}
    assert fingerprint_mismatch_text(found) == \
        "device 'cpu' then, 'cuda' now; gpu None then, 'NVIDIA H200' now"
    assert mismatches(FP, {**FP, "trainer": "other"}) == {}
