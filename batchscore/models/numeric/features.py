"""Numeric feature columns -> one float32 matrix, with a row error for every unusable row.

Features come as several number columns (one feature each) or as one list column (a vector per
row). A row is unusable when a value is null, not finite, or too large for float32 (the model
would see inf), or its vector has the wrong length; the error names the column, and the row
simply gets no line in the matrix. Pure pyarrow/numpy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscore.errors import InputDataError


def is_list(kind: pa.DataType) -> bool:
    types = pa.types
    return types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind)


def as_float(values: pa.Array) -> np.ndarray:
    """Numbers as float64 with NaN where null (nulls are reported separately)."""
    return pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)


def overflows(values: np.ndarray) -> np.ndarray:
    """Finite values that float32 (what the model reads) would turn into inf."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)


def flag(errors: dict[int, str], bad: np.ndarray, message: str) -> None:
    """Record ``message`` for each flagged row that has no error yet (the first problem wins)."""
    for row in np.flatnonzero(bad).tolist():
        errors.setdefault(row, message)


def list_width(column: str, kind: pa.DataType, num_features: int | None) -> int:
    """How many values each row's vector must hold."""
    if num_features:
        return num_features
    if pa.types.is_fixed_size_list(kind):
        return kind.list_size
    raise InputDataError(
        f"column {column!r} holds lists of any length ({kind}); "
        "set [tensor].num_features to the length the model expects"
    )


def vector_column(array: pa.Array, column: str, width: int, errors: dict[int, str]) -> np.ndarray:
    """[rows, width] from one list column; rows with an error hold zeros."""
    n = len(array)
    null = array.is_null().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy().astype(np.int64)
    flag(errors, null, f"column {column!r}: value is null")
    flag(errors, ~null & (lengths != width), f"column {column!r}: expected {width} values")
    values = array.flatten()  # the values of non-null lists only, in row order
    item_null = values.is_null().to_numpy(zero_copy_only=False)
    flat = as_float(values)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owner = np.repeat(np.arange(n), lengths)  # the row of each flattened value
    for bad, what in (
        (item_null, "holds a null"),
        (~item_null & ~np.isfinite(flat), "holds NaN or inf"),
        (overflows(flat), "holds a value too large for float32"),
    ):
        flag(errors, np.isin(np.arange(n), owner[bad]), f"column {column!r}: {what}")
    out = np.zeros((n, width), dtype=np.float32)
    good = np.flatnonzero(~null & (lengths == width))
    if good.size:
        index = starts[good, None] + np.arange(width)
        out[good] = flat[index]
    return out


def feature_matrix(
    table: pa.Table, features: tuple[str, ...], num_features: int | None
) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """(matrix [good rows, features] float32, those rows, {bad row: message})."""
    errors: dict[int, str] = {}
    first = table.schema.field(features[0]).type
    if len(features) == 1 and is_list(first):
        array = table.column(features[0]).combine_chunks()
        width = list_width(features[0], first, num_features)
        matrix = vector_column(array, features[0], width, errors)
    else:
        matrix = np.zeros((table.num_rows, len(features)), dtype=np.float32)
        for j, column in enumerate(features):
            array = table.column(column).combine_chunks()
            if is_list(array.type):
                raise InputDataError(
                    f"column {column!r} is a list; a list column must be the only feature"
                )
            values = as_float(array)
            null = array.is_null().to_numpy(zero_copy_only=False)
            flag(errors, null, f"column {column!r}: value is null")
            flag(errors, ~null & ~np.isfinite(values), f"column {column!r}: NaN or inf")
            flag(errors, overflows(values), f"column {column!r}: value too large for float32")
            matrix[:, j] = values
    rows = np.asarray([i for i in range(table.num_rows) if i not in errors], dtype=np.int64)
    return np.ascontiguousarray(matrix[rows]), rows, errors
