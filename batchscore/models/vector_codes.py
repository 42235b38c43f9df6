"""Vector codes: embeddings written as small integer codes (the job's `[embed].quantize`),
computed as sentence-transformers' ``quantize_embeddings`` computes them, so a vector store
that reads its output reads ours. (Quantized model weights are another thing:
`batchscore.precision`.)

- ``binary`` / ``ubinary``: one bit per dimension, set where the value is above zero, packed
  eight to a byte (``numpy.packbits``: the first dimension in the highest bit, the last byte
  padded with zeros); ``binary`` stores each byte minus 128 as int8. 32x smaller than float32.
- ``int8`` / ``uint8``: each dimension's range (its minimum and maximum over calibration
  vectors) cut into 255 equal steps; a value becomes the step it falls in, clipped to 0-255
  (int8: minus 128). The ranges come from the job's own first distinct texts and are
  written in every data file's footer, so queries can be quantized the same way. A range
  with no width (one text repeated, a constant dimension) is refused, never written as one
  step for every row (`batchscore.job.ranges`).

All arithmetic is float32, as sentence-transformers does it, so a value on a step's boundary
falls the same way. Pure functions over numpy arrays.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batchscore.errors import JobError
from batchscore.job.ranges import Ranges, steps_of, unusable

CALIBRATED = ("int8", "uint8")  # the kinds that need ranges
TYPES = {"int8": pa.int8(), "uint8": pa.uint8(), "binary": pa.int8(), "ubinary": pa.uint8()}


def width(kind: str, dim: int) -> int:
    """Values per vector once quantized: one per dimension, or one byte per eight bits."""
    return dim if kind in CALIBRATED else (dim + 7) // 8


def arrow_type(kind: str, dim: int) -> pa.DataType:
    """The column's type: fixed_size_list<int8|uint8>[dim], or [dim / 8] packed bits."""
    return pa.list_(TYPES[kind], width(kind, dim))


def measure_ranges(vectors: np.ndarray) -> Ranges:
    """Each dimension's minimum and maximum over ``vectors`` [rows, dim] (float32 values, exact
    in JSON). Refused (`JobError`) where a dimension's range has no width: fewer than two
    distinct vectors (sentence-transformers refuses one row; ours refuses one text repeated
    too), or a dimension constant over all of them, since every value would fall on one step
    and every vector be written alike there."""
    if len(vectors) < 2:
        raise unmeasurable(f"only {len(vectors)} text(s) could be scored there")
    vectors = np.asarray(vectors, dtype=np.float32)
    ranges = (tuple(vectors.min(axis=0).tolist()), tuple(vectors.max(axis=0).tolist()))
    flat = unusable(ranges)
    if flat is not None:
        distinct = len(np.unique(vectors, axis=0))
        raise unmeasurable(f"the {distinct} distinct vector(s) there leave {flat}")
    return ranges


def unmeasurable(why: str) -> JobError:
    """The error for ranges the sample cannot give, and ``why``."""
    return JobError(
        '[embed].quantize: "int8" and "uint8" measure each dimension\'s range on the job\'s '
        f"first [quality].sample_rows distinct texts (repeats passed over), and {why}, so "
        "every vector would be written alike there. Give more distinct texts, or "
        '[embed].ranges measured on other texts, or quantize to "binary"'
    )


def to_codes(vectors: np.ndarray, kind: str, ranges: Ranges | None = None) -> np.ndarray:
    """``vectors`` [rows, dim] (float32) as ``kind``'s codes: [rows, `width`] int8 or uint8."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if not len(vectors):  # a window whose every row failed: nothing to calibrate or pack
        dtype = np.int8 if TYPES[kind] == pa.int8() else np.uint8
        return np.zeros((0, width(kind, vectors.shape[-1])), dtype=dtype)
    if kind in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if ranges is None:
        raise ValueError(f"{kind} quantization needs calibration ranges")
    starts, steps = steps_of(ranges)
    if not (np.isfinite(steps) & (steps > 0)).all():  # every way in checks them (`unusable`)
        raise ValueError(f"{kind} quantization: calibration ranges with {unusable(ranges)}")
    values = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return values.astype(np.uint8) if kind == "uint8" else (values - 128).astype(np.int8)


def check_ranges(ranges: Ranges, dim: int, where: str) -> None:
    """Given ranges must hold one number per dimension of the vectors they calibrate."""
    if len(ranges[0]) != dim:
        raise JobError(
            f"[embed].ranges: {len(ranges[0])} numbers per list, and {where} writes vectors of "
            f"{dim} dimensions"
        )


def codes_to_arrow(values: np.ndarray) -> pa.FixedSizeListArray:
    """[rows, width] int8 or uint8 -> fixed_size_list<int8|uint8>[width], from the buffer."""
    values = np.ascontiguousarray(values)
    kind = pa.int8() if values.dtype == np.int8 else pa.uint8()
    flat = pa.Array.from_buffers(kind, values.size, [None, pa.py_buffer(values.reshape(-1))])
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
