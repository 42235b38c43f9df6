"""Row errors: a row that cannot be scored keeps its place and says what was wrong with it.

Under `[output].on_error = "skip"` every output row carries an ``error`` column (a string, null
where the row scored), and the rows recorded with one are listed per chunk under
``_batchscore/rejected/``, one JSON line each: the shard, the row in it, the job's id when it has
one, and the error. Both are made here, and nowhere else; under ``on_error = "fail"`` the first
such row fails its shard instead, and there is no column.
"""

from __future__ import annotations

import json

import pyarrow as pa

from batchscore.work.shards import is_text
from batchscore.work.text_bytes import undecoded

COLUMN = "error"
FIELD = pa.field(COLUMN, pa.string())


def error_fields(on_error: str) -> list[pa.Field]:
    """The error column an output carries after the task's: one under "skip", none under "fail"."""
    return [FIELD] if on_error == "skip" else []


def error_column(errors: dict[int, str], rows: int) -> pa.Array:
    """The error of each of ``rows`` rows (``errors``: row -> message), null where it scored."""
    if not errors:
        return pa.nulls(rows, pa.string())
    return pa.array([errors.get(row) for row in range(rows)], pa.string())


def with_errors(table: pa.Table, errors: dict[int, str]) -> pa.Table:
    """``table`` with these rows' messages in its error column, in place of what it said."""
    if not errors:
        return table
    messages = table.column(COLUMN).to_pylist()
    for row, message in errors.items():
        messages[row] = message
    where = table.schema.get_field_index(COLUMN)
    return table.set_column(where, FIELD, pa.array(messages, pa.string()))


def rejected(
    shard: str, rows: list[int], messages: list[str], ids: pa.Array | None = None
) -> pa.Table:
    """The listing of rows recorded with an error: their shard, their row in it, the job's id
    column's value (``ids``, when it has one) and the error."""
    listing: dict[str, list | pa.Array] = {"shard": [shard] * len(rows), "row": rows}
    if ids is not None:
        listing["id"] = readable(ids)
    listing[COLUMN] = messages
    return pa.table(listing)


def readable(ids: pa.Array) -> pa.Array:
    """Text ids as a listing can hold them: an id whose bytes are not UTF-8 (its row is listed
    for another reason, or for that one) written with backslash escapes for those bytes,
    where JSON, and turning the id into Python, would fail on the whole chunk's listing."""
    if not is_text(ids.type):
        return ids
    raw = undecoded(ids).to_pylist()
    return pa.array([None if v is None else v.decode("utf-8", "backslashreplace") for v in raw])


def rejected_lines(listings: list[pa.Table]) -> str:
    """A chunk's listings as ``_batchscore/rejected/`` keeps them: one JSON object per line."""
    rows = pa.concat_tables(listings).to_pylist()
    return "".join(json.dumps(row, default=str) + "\n" for row in rows)
