"""Parameter updates (final - initial) are only as exact as float32's rounding of the parameter:
a one-step difference on a norm weight's tiny update is rounding, not a bug; a skipped update
is still a failure."""

import numpy as np

from harness.compare.diff import compare_gradients
from harness.compare.verdict import UPDATE_RESOLUTION, update_threshold
from harness.contracts.tolerance import Tolerance

ULP_AT_ONE = 2.0**-23


def write(folder, arrays):
    folder.mkdir()
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", np.asarray(array, dtype=np.float32))


def test_a_rounding_step_on_a_tiny_norm_update_passes_a_skipped_update_fails(tmp_path):
    ref_norm_update = np.full(32, 7.5e-7, dtype=np.float32)  # measured: ||.|| 4.2e-6 on 32
    got_norm_update = ref_norm_update.copy()
    got_norm_update[3] += ULP_AT_ONE  # one float32 step at 1.0: what bf16 PP2 moved it by
    head_update = np.full((64, 32), 1e-5, dtype=np.float32)
    write(tmp_path / "ref", {"h.1.ln_2.weight": ref_norm_update, "lm_head.weight": head_update})
    write(tmp_path / "got", {"h.1.ln_2.weight": got_norm_update,
                             "lm_head.weight": np.zeros_like(head_update)})  # update skipped
    threshold = update_threshold("bfloat16")
    tol = Tolerance(1e-2)
    with_floor = compare_gradients(tmp_path / "got", tmp_path / "ref", tol, relative=threshold,
                                   resolution=UPDATE_RESOLUTION)
    assert [d.name for d in with_floor.relative_failures] == ["lm_head.weight"]
    assert not with_floor.ok
    without = compare_gradients(tmp_path / "got", tmp_path / "ref", tol, relative=threshold)
    # Without the floor the rounding step alone is over the threshold (the false failure).
    assert [d.name for d in without.relative_failures] == ["lm_head.weight", "h.1.ln_2.weight"]
