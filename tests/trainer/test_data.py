import numpy as np
import pytest

from harness.trainer.data import StepBatches, data_parallel_shard


def test_microbatches_are_consecutive_windows_in_file_order():
    tokens = np.arange(100, dtype=np.uint16)
    batches = StepBatches(tokens, batch_size=2, sequence_length=4, microbatches=3)
    inputs, targets = batches.next_step()
    assert inputs.shape == targets.shape == (3, 2, 4)
    # sample i of the stream is tokens[i*T : i*T + T + 1]
    for sample in range(6):
        m, b = divmod(sample, 2)
        np.testing.assert_array_equal(inputs[m, b], tokens[sample * 4 : sample * 4 + 4])
        np.testing.assert_array_equal(targets[m, b], tokens[sample * 4 + 1 : sample * 4 + 5])
    second, _ = batches.next_step()
    np.testing.assert_array_equal(second[0, 0], tokens[24:28])


def test_position_returns_to_zero_when_a_microbatch_would_run_past_the_end():
    tokens = np.arange(20, dtype=np.int32)  # room for two microbatches of 8 (+1) tokens
    batches = StepBatches(tokens, batch_size=2, sequence_length=4, microbatches=3)
    inputs, targets = batches.next_step()
    np.testing.assert_array_equal(inputs[0], inputs[2])
    np.testing.assert_array_equal(targets[1].ravel(), tokens[9:17])


def test_data_parallel_shards_together_are_the_single_device_step():
    tokens = np.arange(1000, dtype=np.uint16)
    inputs, _ = StepBatches(tokens, 2, 4, microbatches=4).next_step()
    shards = [data_parallel_shard(inputs, rank, 2) for rank in range(2)]
    assert all(shard.shape == (2, 2, 4) for shard in shards)
    merged = np.concatenate(shards)
    assert sorted(map(tuple, merged.reshape(-1, 4))) == sorted(map(tuple, inputs.reshape(-1, 4)))
    # llm.c order: rank r takes microbatches r, r + dp, ...
    np.testing.assert_array_equal(shards[1][0], inputs[1])


def test_a_file_shorter_than_one_microbatch_is_refused():
    with pytest.raises(ValueError, match=r"holds 8 tokens, fewer than one microbatch needs .* = 9"):
        StepBatches(np.arange(8), batch_size=2, sequence_length=4, microbatches=1)
