"""A window's output rows in input order: the carried columns, the task's columns (null for a
row that failed) and the error column, put together from what the model returned for the rows
it ran.

Arrays are built from numpy buffers, never with ``pa.array`` over numpy: that first asks whether
its input is a pandas object, which imports pandas (0.4 s of a run that never needed it).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batchscore.work.row_errors import FIELD, error_column


def assemble(
    table: pa.Table,
    columns: dict[str, pa.Array],
    *,
    carried: tuple[str, ...],
    fields: list[pa.Field],
    encoded_rows: np.ndarray,
    errors: dict[int, str],
    with_error_column: bool,
) -> pa.Table:
    """Output rows in input order: carried columns, task columns (null for failed rows), error."""
    n = table.num_rows
    position = np.full(n, -1, dtype=np.int64)
    position[encoded_rows] = np.arange(len(encoded_rows))
    position[list(errors)] = -1
    missing = position < 0
    valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    take = pa.Array.from_buffers(
        pa.int64(), n, [valid, pa.py_buffer(position)], null_count=int(missing.sum())
    )
    in_place = not errors and len(encoded_rows) == n
    out = table.select(list(carried))
    for f in fields:
        if f.name not in columns:
            values = pa.nulls(n, f.type)
        else:
            values = columns[f.name] if in_place else columns[f.name].take(take)
        out = out.append_column(f, values)
    if with_error_column:
        out = out.append_column(FIELD, error_column(errors, n))
    return out
