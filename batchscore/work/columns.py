"""One Arrow layout per kind of column, so that rows of different shards go together.

The same values come in many layouts: pyarrow writes text as ``string``, polars as
``large_string``, a pandas categorical as a ``dictionary``; an id is int32 in one shard and int64
in the next. The reader hands every table on in one layout (`normalized`), so a window of many
shards, the quality gate's sample and the plan's timed rows concatenate, and every data file
carries each column in that same layout whatever shard came first (`canonical`). Values are
never changed: only their encoding is.

Across runs the same column may come in a wider type: int32 where the folder holds int64,
float32 where it holds float64, microseconds where it holds nanoseconds. `holds` says which
types a column's type takes in without losing a value, `same_kind` which may fit value by value
(`cast_exactly` checks each one), so that one folder keeps one schema: those are cast, any
other is refused (`batchscore.output.drift`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscore.work.row_hash import value_words
from batchscore.work.shards import is_text

WIDE = pa.uint64()  # the one integer type int64 cannot hold every value of: kept as it is
NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}  # a moment's unit in nanoseconds
UTC = {None, "UTC", "Etc/UTC", "+00:00", "Z"}  # naive, or the zone naive moments are in


def canonical(kind: pa.DataType) -> pa.DataType:
    """The layout a column of ``kind`` is read and written in: dictionaries decoded, text as
    ``string``, bytes as ``binary``, integers as ``int64`` (``uint64`` kept); anything else as
    it is."""
    types = pa.types
    if types.is_dictionary(kind):
        return canonical(kind.value_type)
    if is_text(kind):
        return pa.string()
    if types.is_binary(kind) or types.is_large_binary(kind) or types.is_binary_view(kind):
        return pa.binary()
    if types.is_integer(kind) and kind != WIDE:
        return pa.int64()
    return kind


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field in its `canonical` layout (names and metadata kept)."""
    return pa.schema([f.with_type(canonical(f.type)) for f in schema], schema.metadata)


def normalized(table: pa.Table) -> pa.Table:
    """``table`` in `canonical` layouts; a table already in them is returned as it is (the
    common case costs a schema comparison). Raises ``pa.ArrowInvalid`` when a column does not
    fit (``large_string`` text past 2 GiB in one table)."""
    target = canonical_schema(table.schema)
    return table if target.equals(table.schema) else table.cast(target)


def gather(tables: list[pa.Table]) -> pa.Table | None:
    """Tables of different shards as one, numbers promoted where they differ (float32 and
    float64: float64); a table whose columns cannot join the first's is left out. None when
    there is no table."""
    kept: list[pa.Table] = []
    schema = None
    for table in tables:
        try:
            joined = table.schema if schema is None else unify(schema, table.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            continue
        schema = joined
        kept.append(table)
    if not kept:
        return None
    return pa.concat_tables([t.cast(schema) for t in kept])


def unify(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    """One schema for tables of ``a`` and ``b`` with the same column names, or an Arrow error."""
    if a.names != b.names:
        raise pa.ArrowInvalid(f"columns {a.names} and {b.names} differ")
    return pa.unify_schemas([a, b], promote_options="permissive")


def holds(target: pa.DataType, found: pa.DataType) -> bool:
    """Whether a column of ``target`` holds every value of one of ``found`` exactly: any layout
    of text as text (of bytes as bytes), a narrower integer in a wider one, a narrower float
    in a wider one, a coarser unit of moments, times or durations in a finer one, a date as a
    date, a decimal in one with as many digits before and after the point, lists and structs
    whose values each hold; nulls anywhere.

    Moments keep their zone: a zoned column holds any zone (the same instants), and naive and
    UTC moments hold each other (Spark and INT96 write pandas' naive moments as UTC instants of
    the same numbers); naive and another zone do not (the wall clock and the instant differ)."""
    return fits(target, found, every=True)


def same_kind(target: pa.DataType, found: pa.DataType) -> bool:
    """Whether some values of ``found`` may fit ``target`` exactly, though not every one
    (`holds`): integers, floats, decimals, dates, and moments (zones as `holds` says) in
    narrower types of their own kind, each value then checked (`cast_exactly`). An integer
    and a float, text and a number, are two kinds: never cast."""
    return fits(target, found, every=False)


def fits(target: pa.DataType, found: pa.DataType, *, every: bool) -> bool:
    """`holds` (``every``) or `same_kind`."""
    types = pa.types
    if found == target or types.is_null(found):
        return True
    if types.is_dictionary(found) or types.is_dictionary(target):
        return fits(plain_type(target), plain_type(found), every=every)
    for kind in (is_text, is_bytes, types.is_date):
        if kind(target) or kind(found):  # date64's milliseconds are whole days (Arrow's rule)
            return kind(target) and kind(found)
    if types.is_integer(target) and types.is_integer(found):
        return integer_fits(target, found) or not every
    if types.is_floating(target) and types.is_floating(found):
        return found.bit_width <= target.bit_width or not every
    if types.is_decimal(target) and types.is_decimal(found):
        digits = found.precision - found.scale <= target.precision - target.scale
        return (found.scale <= target.scale and digits) or not every
    return moment_fits(target, found, every=every) or nested_fits(target, found, every=every)


def plain_type(kind: pa.DataType) -> pa.DataType:
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def is_bytes(kind: pa.DataType) -> bool:
    types = pa.types
    return (
        types.is_binary(kind)
        or types.is_large_binary(kind)
        or types.is_binary_view(kind)
        or types.is_fixed_size_binary(kind)
    )


def integer_fits(target: pa.DataType, found: pa.DataType) -> bool:
    types = pa.types
    if types.is_signed_integer(target):
        signed = types.is_signed_integer(found)
        return found.bit_width <= target.bit_width if signed else found.bit_width < target.bit_width
    return types.is_unsigned_integer(found) and found.bit_width <= target.bit_width


def moment_fits(target: pa.DataType, found: pa.DataType, *, every: bool) -> bool:
    types = pa.types
    for kind in (types.is_timestamp, types.is_duration, types.is_time):
        if kind(target) and kind(found):
            finer = NANOS[found.unit] >= NANOS[target.unit] or not every
            if not types.is_timestamp(target):
                return finer
            zones = target.tz, found.tz
            return finer and (None not in zones or set(zones) <= UTC)
    return False


def nested_fits(target: pa.DataType, found: pa.DataType, *, every: bool) -> bool:
    """Lists (any layout; a fixed size only in the same size) and structs (the same fields,
    in order) whose values each fit."""
    types = pa.types
    lists = (types.is_list, types.is_large_list, types.is_list_view, types.is_large_list_view)
    if types.is_fixed_size_list(target):
        sized = types.is_fixed_size_list(found) and found.list_size == target.list_size
        return sized and fits(target.value_type, found.value_type, every=every)
    if any(test(target) for test in lists):
        listed = types.is_fixed_size_list(found) or any(test(found) for test in lists)
        return listed and fits(target.value_type, found.value_type, every=every)
    if types.is_struct(target) and types.is_struct(found):
        names = [f.name for f in target] == [f.name for f in found]
        pairs = zip(target, found, strict=True)
        return names and all(fits(t.type, f.type, every=every) for t, f in pairs)
    return False


def common(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type that holds every value of both ``a`` and ``b`` (`holds`): one of
    them, or for decimals one with the digits of each before and after the point; None when
    there is none (an integer and a string, int64 and uint64)."""
    if holds(a, b):
        return a
    if holds(b, a):
        return b
    types = pa.types
    if types.is_decimal(a) and types.is_decimal(b):
        scale = max(a.scale, b.scale)
        precision = max(a.precision - a.scale, b.precision - b.scale) + scale
        if precision <= 76:
            return (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale)
    return None


class InexactCast(pa.ArrowInvalid):
    """A value that a column's new type would not hold exactly: names the column, and the
    row of the table cast (``row``)."""

    def __init__(self, column: str, row: int, detail: str) -> None:
        super().__init__(f"column {column!r}: {detail}")
        self.column, self.row = column, row


def cast_exactly(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (its columns in ``schema``'s order) in ``schema``'s types, every value kept
    exactly: where a type does not hold every value of the table's (`holds`), each value is
    checked (a cast that overflows, truncates or rounds, float64 to float32 included, which
    Arrow's safe cast lets through), raising `InexactCast` for the first that changes."""
    columns = []
    for name in schema.names:
        column, target = table.column(name), schema.field(name).type
        if column.type == target:
            columns.append(column)
            continue
        refused = None
        try:
            cast = column.cast(target)  # Arrow's safe cast: overflow and truncation raise
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            refused = exc
            try:  # the cast as it would round, to name the first value that changes
                cast = pc.cast(column, target, safe=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise InexactCast(name, -1, str(exc)) from exc
        if refused is not None or not holds(target, column.type):
            before, after = column.combine_chunks(), cast.combine_chunks()
            changed = np.flatnonzero(value_words(before) != value_words(after))
            if changed.size:
                row = int(changed[0])
                said = f"{before[row]} is not exactly a {target} value ({after[row]} would be)"
                raise InexactCast(name, row, said)
            if refused is not None:
                raise InexactCast(name, -1, str(refused))
        columns.append(cast)
    return pa.Table.from_arrays(columns, schema=schema)
