"""Calibration ranges of int8 / uint8 embeddings: each dimension's minimum, then its maximum,
whichever way they come (`[embed].ranges`, measured on a job's rows, or read back from an
output folder's record).

Quantizing cuts each dimension's range into 255 equal steps, in float32 as
sentence-transformers does. A range float32 cannot cut (a minimum equal to its maximum, a
width too narrow to step through or too wide to hold) would put every value of the dimension
on one step, silently; such ranges are refused wherever they come from, by this one check,
which is the very arithmetic `batchscore.models.vector_codes` does.
"""

from __future__ import annotations

import numpy as np

Ranges = tuple[tuple[float, ...], ...]  # (minimums, maximums), one number per dimension


def steps_of(ranges: Ranges | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each dimension's start and step, float32, as quantizing computes them (a number past
    float32's largest becomes infinite, as numpy casts it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        bounds = np.asarray(ranges, dtype=np.float64).astype(np.float32)
        starts = bounds[0, :]
        return starts, (bounds[1, :] - starts) / np.float32(255)


def unusable(ranges: Ranges) -> str | None:
    """The first dimension whose range cannot be cut into 255 float32 steps, in words (None
    when every one can): dimensions are counted from 0, as a vector's index counts them."""
    starts, steps = steps_of(ranges)
    bad = ~(np.isfinite(steps) & (steps > 0))
    if not bad.any():
        return None
    dim = int(np.argmax(bad))
    low, high = ranges[0][dim], ranges[1][dim]
    where = f"dimension {dim} (from 0)"
    if not (np.isfinite(low) and np.isfinite(high)):
        return f"{where}: {low!r} to {high!r} is not a range of finite numbers"
    if low == high:
        return f"{where}: its minimum and maximum are both {low!r}"
    if not np.isfinite(starts[dim]) or not np.isfinite(steps[dim]):
        return f"{where}: {low!r} to {high!r} is wider than float32 holds"
    if low > high:
        return f"{where}: its minimum {low!r} is above its maximum {high!r}"
    return f"{where}: {low!r} to {high!r} is too narrow to cut into 255 float32 steps"


def ranges_problems(quantize: str | None, ranges: Ranges | None) -> list[str]:
    """What is wrong with `[embed].ranges` beside `quantize` (each message starts with its
    key): ranges calibrate int8 and uint8 codes alone, as two lists of one number per
    dimension, each dimension cut into 255 steps (`unusable`)."""
    if ranges is None:
        return []
    if quantize not in ("int8", "uint8"):
        return ['ranges: they calibrate quantize = "int8" or "uint8" only']
    if len(ranges) != 2 or len(ranges[0]) != len(ranges[1]) or not ranges[0]:
        return ["ranges: expected two lists of one number per dimension"]
    if any(low > high for low, high in zip(*ranges, strict=True)):
        return ["ranges: the first list holds the minimums, the second the maximums"]
    if flat := unusable(ranges):
        return [
            f"ranges: {flat}: every value there would be written as one step; give each "
            "dimension a minimum below its maximum"
        ]
    return []
