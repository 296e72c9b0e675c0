"""On CPU, keep freed buffers in the process instead of handing them back to the kernel.

glibc's malloc serves a large request (above its mmap threshold, which adapts up to 32 MiB)
with a fresh `mmap`, and trims the top of the heap once more than twice that threshold is free
there. A training step allocates and frees the same large buffers every microbatch (the lm
head's logits and their gradient are 8 MiB each for a 16384-token vocabulary at 2 x 64 tokens),
so with those defaults each one comes back as fresh pages, and the kernel faults in and zeroes
every page again. How often that happens depends on which other buffers are alive at the time,
that is on the layers a pipeline rank holds: a layer's cost then depends on its neighbours.
Measured (docs/benchmarks.md#allocator-fix): the lm head's backward took about 40 ms a microbatch in a
chunk with two layers and 30-32 ms alone, and 27-29 ms in both once freed memory was kept.

CUDA's caching allocator keeps freed blocks for reuse, which is what the layout suggestion's
additive per-layer costs assume; this gives the CPU trainer the same. Nothing numerical
changes: only where the bytes come from.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2, 32 MiB on 64-bit hosts: requests
# above it are still mapped and unmapped each time.
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**31 - 1  # trim the heap's top only past 2 GiB free (mallopt takes an int)
TOP_PAD = 64 * 2**20  # grow the heap in 64 MiB steps


def keep_freed_memory() -> bool:
    """Tune this process's malloc as above; False where the C library has no `mallopt` (not
    glibc) or refuses a setting, which leaves the defaults and costs only speed."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except AttributeError:  # musl, macOS: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (M_TOP_PAD, TOP_PAD))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
