"""One gradient file pair, read once, every statistic of both verdicts in one pass.

The files are plain `.npy` float32 (harness.trainer.gradient_dump). Both are read block by block
(BLOCK elements, a few MB, so a block stays in cache while it is reduced) straight into reused
buffers after the header, with no float64 copy of the whole array. Per block, in float32: the
difference, the three sums of squares (||ref||, ||got||, ||got - ref||, summed up in float64
across blocks), the largest |difference| and where it is. The element-wise check is decided
exactly as the float64 code did (`|got - ref| <= atol + rtol * |ref|` in float64): only the
elements float32 puts within a hair of the bound are re-checked in float64, and the worst
element's values are recomputed in float64.

Anything else (another dtype, Fortran order, a non-finite value, a sum of squares that
overflows float32) goes through `exact_stats`, the float64 path, so the answer never depends on
which path ran. Plain numpy, no torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

BLOCK = 1 << 18  # elements per block: 1 MiB per float32 buffer
_F32 = np.dtype("<f4")
_HAIR = 1e-5  # float32 rounding of the difference is 6e-8 relative; re-check within 1e-5


class UnreadableError(ValueError):
    """A gradient file that is cut short, not .npy, or otherwise unreadable."""


class ShapeError(ValueError):
    def __init__(self, got: tuple, ref: tuple) -> None:
        super().__init__(f"shape {got}, reference {ref}")
        self.got, self.ref = got, ref


@dataclass
class FileStats:
    shape: tuple[int, ...]
    elements: int
    mismatched: int
    nonfinite: int
    max_abs_diff: float  # over finite elements
    worst_excess: float  # max of |d| - allowed (inf where the run is not finite)
    worst_index: tuple[int, ...]
    worst_got: float
    worst_ref: float
    ref_norm: float
    got_norm: float
    diff_norm: float


def _header(stream) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    raise ValueError(f"unsupported .npy version {version}")


def diff_files(got_path, ref_path, atol: float, rtol: float) -> FileStats:
    """Raises UnreadableError for a run file that cannot be read, ShapeError for a shape change;
    a bad reference file raises what numpy raises."""
    with open(ref_path, "rb") as ref_stream:
        ref_shape, ref_fortran, ref_dtype = _header(ref_stream)
        try:
            got_stream = open(got_path, "rb")
        except OSError as error:
            raise UnreadableError(str(error)) from error
        with got_stream:
            try:
                got_shape, got_fortran, got_dtype = _header(got_stream)
            except (OSError, ValueError, EOFError) as error:
                raise UnreadableError(str(error)) from error
            got_shape, ref_shape = tuple(got_shape), tuple(ref_shape)
            if got_shape != ref_shape:
                raise ShapeError(got_shape, ref_shape)
            n = math.prod(ref_shape)
            fast = (got_dtype == _F32 and ref_dtype == _F32 and not got_fortran
                    and not ref_fortran and n > 0)  # empty: the exact path answers at once
            if fast:
                for stream, what in ((got_stream, "the run's"), (ref_stream, "the reference's")):
                    left = os.fstat(stream.fileno()).st_size - stream.tell()
                    if left != n * 4:
                        error = (f"{what} file holds {left} bytes of data, "
                                 f"{n * 4} expected for shape {ref_shape}")
                        if stream is got_stream:
                            raise UnreadableError(error)
                        raise ValueError(error)
                # an overflow or NaN is detected in the sums and sent to the exact path:
                # not a warning for the user
                with np.errstate(over="ignore", invalid="ignore"):
                    stats = _block_stats(got_stream, ref_stream, ref_shape, n, atol, rtol)
                if stats is not None:
                    return stats
    return exact_stats(_load_got(got_path), np.load(ref_path, allow_pickle=False), atol, rtol)


def _load_got(path) -> np.ndarray:
    try:  # never unpickle: a run's file is data, not code
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise UnreadableError(f"{path}: {error}") from error


def _block_stats(got_stream, ref_stream, shape, n, atol, rtol) -> FileStats | None:
    """The one-pass float32 statistics of n > 0 elements; None where the float64 path must
    decide (non-finite values or an overflowing sum of squares). The first block overwrites
    every running maximum (|d| >= 0 > -1, a finite excess > -inf)."""
    size = min(BLOCK, n)
    got_buf, ref_buf, diff_buf = (np.empty(size, np.float32) for _ in range(3))
    allowed_buf = np.empty(size, np.float32) if rtol else None
    atol32, rtol32 = np.float32(atol), np.float32(rtol)
    near = np.float32(atol * (1 - _HAIR))  # rtol == 0: |d| above this is re-checked
    ref_sq = got_sq = diff_sq = 0.0
    mismatched = 0
    max_d, max_at = -1.0, 0
    worst_x, worst_at, worst_got, worst_ref = -math.inf, 0, 0.0, 0.0
    max_got = max_ref = 0.0
    for start in range(0, n, size):
        k = min(size, n - start)
        got, ref, d = got_buf[:k], ref_buf[:k], diff_buf[:k]
        if got_stream.readinto(got) != 4 * k:
            raise UnreadableError("the run's file is cut short")
        if ref_stream.readinto(ref) != 4 * k:
            raise ValueError("the reference file is cut short")
        np.subtract(got, ref, out=d)
        ref_sq += float(np.dot(ref, ref))
        got_sq += float(np.dot(got, got))
        diff_sq += float(np.dot(d, d))
        if not (math.isfinite(diff_sq) and math.isfinite(got_sq) and math.isfinite(ref_sq)):
            return None  # NaN / inf somewhere, or squares beyond float32: the exact path
        np.abs(d, out=d)
        j = int(np.argmax(d))
        if d[j] > max_d:
            max_d, max_at = float(d[j]), start + j
            max_got, max_ref = float(got[j]), float(ref[j])
        if rtol:
            allowed = allowed_buf[:k]
            np.abs(ref, out=allowed)
            allowed *= rtol32
            allowed += atol32
            excess = allowed  # reuse: d - allowed
            np.subtract(d, allowed, out=excess)
            j = int(np.argmax(excess))
            got64, ref64 = float(got[j]), float(ref[j])
            x = abs(got64 - ref64) - (atol + rtol * abs(ref64))
            if x > worst_x:
                worst_x, worst_at, worst_got, worst_ref = x, start + j, got64, ref64
            # near the bound: excess > -HAIR * allowed, i.e. excess + HAIR * allowed > 0
            candidates = np.flatnonzero(excess > -_HAIR * (atol32 + rtol32 * np.abs(ref)))
        else:
            candidates = np.flatnonzero(d > near) if d[j] > near else ()
        if len(candidates):
            g64 = got[candidates].astype(np.float64)
            r64 = ref[candidates].astype(np.float64)
            mismatched += int(np.count_nonzero(~(np.abs(g64 - r64) <= atol + rtol * np.abs(r64))))
    if not rtol:
        worst_at, worst_got, worst_ref = max_at, max_got, max_ref
        worst_x = abs(max_got - max_ref) - atol
    return FileStats(shape=tuple(shape), elements=n, mismatched=mismatched, nonfinite=0,
                     max_abs_diff=abs(max_got - max_ref), worst_excess=worst_x,
                     worst_index=tuple(int(i) for i in np.unravel_index(worst_at, shape)),
                     worst_got=worst_got, worst_ref=worst_ref, ref_norm=math.sqrt(ref_sq),
                     got_norm=math.sqrt(got_sq), diff_norm=math.sqrt(diff_sq))


def exact_stats(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> FileStats:
    """The float64 path (any dtype, non-finite values): the original element-wise code plus
    the norms. inf - inf and squares beyond float64 are part of the answer (NaN / inf), not
    warnings."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ShapeError(tuple(got.shape), tuple(ref.shape))
    if not got.size:
        return FileStats(shape=tuple(got.shape), elements=0, mismatched=0, nonfinite=0,
                         max_abs_diff=0.0, worst_excess=0.0, worst_index=(), worst_got=0.0,
                         worst_ref=0.0, ref_norm=0.0, got_norm=0.0, diff_norm=0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        delta = np.abs(got - ref)
        allowed = atol + rtol * np.abs(ref)
        bad = ~(delta <= allowed)
        excess = np.where(np.isfinite(delta), delta - allowed, np.inf)
        flat = int(np.argmax(excess))
        finite_delta = delta[np.isfinite(delta)]
        norms = [float(np.linalg.norm(a.ravel())) for a in (ref, got, got - ref)]
    return FileStats(
        shape=tuple(got.shape), elements=int(got.size), mismatched=int(bad.sum()),
        nonfinite=int((~np.isfinite(got)).sum()),
        max_abs_diff=float(finite_delta.max()) if finite_delta.size else 0.0,
        worst_excess=float(excess.flat[flat]),
        worst_index=tuple(int(i) for i in np.unravel_index(flat, got.shape)),
        worst_got=float(got.flat[flat]), worst_ref=float(ref.flat[flat]),
        ref_norm=norms[0], got_norm=norms[1], diff_norm=norms[2],
    )
