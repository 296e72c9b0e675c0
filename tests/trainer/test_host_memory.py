"""The CPU trainer's malloc settings (harness.trainer.host_memory): the large buffers a step
frees come back without the kernel faulting their pages in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each round holds four 8 MiB buffers at once, then frees them: with glibc's defaults the freed
# top of the heap is trimmed and the next round's pages are faulted in again.
ROUNDS = """
import resource, sys
import numpy as np
from harness.trainer.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(12):
    if i == 4:
        start = faults()
    held = [np.ones(2**20) for _ in range(4)]
    del held
print((faults() - start) / 8)
"""


def _faults_per_round(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_large_buffers_are_reused_without_page_faults():
    default, kept = _faults_per_round("default"), _faults_per_round("keep")
    # The defaults fault in at least a quarter of the 8192 pages each round (numpy may back
    # them with huge pages); kept, the same rounds reuse the heap.
    assert default > 1500, f"the default malloc faulted {default} pages a round; the test expects the trim it guards against"
    assert kept < default / 100, f"with keep_freed_memory() {kept} page faults a round, against {default} without"

