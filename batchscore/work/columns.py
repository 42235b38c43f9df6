"""One Arrow layout per kind of column, so that rows of different shards go together.

The same values come in many layouts: pyarrow writes text as ``string``, polars as
``large_string``, a pandas categorical as a ``dictionary``; an id is int32 in one shard and int64
in the next. The reader hands every table on in one layout (`normalized`), so a window of many
shards, the quality gate's sample and the plan's timed rows concatenate, and every data file
carries each column in that same layout whatever shard came first (`canonical`). Values are
never changed: only their encoding is.
"""

from __future__ import annotations

import pyarrow as pa

from batchscore.work.shards import is_text

WIDE = pa.uint64()  # the one integer type int64 cannot hold every value of: kept as it is


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


def undecoded_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every text in it, nested ones too, as bytes (dictionaries decoded)."""
    types = pa.types
    if types.is_dictionary(kind):
        return undecoded_type(kind.value_type)
    if is_text(kind):
        return pa.large_binary()
    if types.is_struct(kind):
        return pa.struct([field.with_type(undecoded_type(field.type)) for field in kind])
    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        inner = kind.value_field.with_type(undecoded_type(kind.value_type))
        if types.is_fixed_size_list(kind):
            return pa.list_(inner, kind.list_size)
        return pa.large_list(inner) if types.is_large_list(kind) else pa.list_(inner)
    if types.is_map(kind):
        return pa.map_(undecoded_type(kind.key_type), undecoded_type(kind.item_type))
    return kind


def undecoded(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` with its texts as their bytes, so that turning it into Python objects never
    decodes UTF-8: an input's text is checked row by row where it is read
    (`batchscore.models.text.inputs`), and a row of bytes that are not UTF-8 is that row's
    error there, where ``to_pylist`` on the column would raise for the whole window."""
    target = undecoded_type(column.type)
    return column if target.equals(column.type) else column.cast(target)
