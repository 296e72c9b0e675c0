"""harness.trainer.gradient_dump: the gradient files and their manifest."""

import numpy as np
import pytest

from harness.trainer.gradient_dump import read_manifest, write_gradients, write_manifest


def test_gradient_dump_round_trips_and_manifest_lists_each_name_once(tmp_path):
    import torch

    gradients = [("h.3.attn.c_attn.weight", torch.ones(6, 2)), ("wte.weight", torch.arange(4.0))]
    entries = write_gradients(tmp_path, gradients, rank=1)
    write_manifest(tmp_path, entries, step=1)
    np.testing.assert_array_equal(np.load(tmp_path / "h.3.attn.c_attn.weight.npy"), np.ones((6, 2)))
    manifest = read_manifest(tmp_path)
    assert [p["name"] for p in manifest["parameters"]] == ["h.3.attn.c_attn.weight", "wte.weight"]
    assert manifest["parameters"][0] == {"name": "h.3.attn.c_attn.weight", "shape": [6, 2], "rank": 1}
    assert not list(tmp_path.glob(".*partial"))


def test_manifest_refuses_a_parameter_written_twice(tmp_path):
    entries = [{"name": "wte.weight", "shape": [2], "rank": 0},
               {"name": "wte.weight", "shape": [2], "rank": 1}]
    with pytest.raises(RuntimeError, match=r"more than one rank: \['wte.weight'\]"):
        write_manifest(tmp_path, entries, step=1)
