"""Batches in file order, as llm.c's and InfiniTrain's data loaders read them.

A microbatch of B sequences starts at a token position p and covers tokens[p : p + B*T + 1]:
inputs are the first B*T tokens, targets the same shifted by one. The next microbatch starts at
p + B*T; when a microbatch would run past the end of the file the position returns to 0.

An optimizer step consumes `microbatches` consecutive microbatches. With data parallelism, as in
llm.c, data-parallel rank r takes microbatches r, r + dp, r + 2 dp, ... of the step, so the ranks
together see exactly the single-device step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StepBatches:
    tokens: np.ndarray
    batch_size: int
    sequence_length: int
    microbatches: int  # per step, over all data-parallel ranks

    def __post_init__(self) -> None:
        needed = self.batch_size * self.sequence_length + 1
        if len(self.tokens) < needed:
            raise ValueError(
                f"the token file holds {len(self.tokens)} tokens, fewer than one microbatch "
                f"needs (batch_size * sequence_length + 1 = {needed})"
            )
        self._position = 0

    def _next_microbatch(self) -> np.ndarray:
        span = self.batch_size * self.sequence_length
        if self._position + span + 1 > len(self.tokens):
            self._position = 0
        window = np.asarray(self.tokens[self._position : self._position + span + 1], dtype=np.int64)
        self._position += span
        return window

    def next_step(self) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), each (microbatches, batch_size, sequence_length) int64."""
        shape = (self.batch_size, self.sequence_length)
        windows = [self._next_microbatch() for _ in range(self.microbatches)]
        inputs = np.stack([w[:-1].reshape(shape) for w in windows])
        targets = np.stack([w[1:].reshape(shape) for w in windows])
        return inputs, targets


def data_parallel_shard(step: np.ndarray, rank: int, size: int) -> np.ndarray:
    """The microbatches of a step that data-parallel rank `rank` of `size` trains on."""
    return step[rank::size]
