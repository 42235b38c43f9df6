"""An Iceberg table's columns against batchscore's files: the types Iceberg holds, and whether
the table still takes batchscore's files.

Iceberg has no fixed-size lists, no unsigned integers, no 8- or 16-bit integers, no half floats
and (before format 3) no timestamps finer than a microsecond. pyiceberg's own conversion makes
a ``uint32`` column an Iceberg ``int`` (32 bits: its upper half lost) and a ``float16`` a
``float``, and a file whose Arrow schema (in its footer) says ``fixed_size_list`` where the
table says ``list`` is refused by polars' Iceberg reader. So batchscore writes an Iceberg
table's files in the types the table holds (`fit`), as it does for Delta: vectors as lists,
small and unsigned integers widened, times in microseconds; the Parquet footers still carry
batchscore's metadata.

A shared table evolves, as a Delta table does (`batchscore.output.delta_columns`): a column
another writer adds, nullable, is fine (readers read nulls in batchscore's files, by the
table's name mapping); a column batchscore writes that the table dropped, renamed or retyped,
or a column the table requires that batchscore's files lack, is refused, naming it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchscore.errors import JobError, WriteError
from batchscore.output.format import WHAT_TO_DO

SMALL_INTS = (pa.int8(), pa.int16(), pa.uint8(), pa.uint16())


def fit(schema: pa.Schema) -> pa.Schema:
    """The output schema as an Iceberg table holds it (metadata kept); a column Iceberg cannot
    hold (``uint64``, a decimal past 38 digits) is refused, naming it."""
    return pa.schema([field.with_type(iceberg_type(field)) for field in schema], schema.metadata)


def iceberg_type(field: pa.Field) -> pa.DataType:
    """A column's type as Iceberg holds it (nested types converted throughout)."""
    kind = field.type
    if pa.types.is_dictionary(kind):
        return iceberg_type(field.with_type(kind.value_type))
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(iceberg_type(kind.value_field)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(iceberg_type(f)) for f in kind])
    if pa.types.is_map(kind):
        key, item = kind.key_field, kind.item_field
        return pa.map_(key.with_type(iceberg_type(key)), item.with_type(iceberg_type(item)))
    if kind in SMALL_INTS:
        return pa.int32()
    if kind == pa.uint32():
        return pa.int64()
    if kind == pa.float16():
        return pa.float32()
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", kind.tz)
    if pa.types.is_date64(kind):
        return pa.date32()
    if pa.types.is_time(kind):
        return pa.time64("us")
    if kind == pa.uint64() or (pa.types.is_decimal(kind) and kind.precision > 38):
        raise JobError(
            f'[output].format = "iceberg": column {field.name!r} is {kind}, which Iceberg '
            "cannot hold; cast it in the input, or write Parquet"
        )
    return kind


def said(kind: pa.DataType) -> str:
    """An Arrow type by the Iceberg type it is (``string``, ``list<float>``, ``long``), so
    that two layouts of one type (string and large_string, a list's element named either
    way, the field ids pyiceberg attaches) compare equal and read as a person reads them."""
    if pa.types.is_dictionary(kind):
        return said(kind.value_type)
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{said(kind.value_type)}>"
    if pa.types.is_map(kind):
        return f"map<{said(kind.key_type)}, {said(kind.item_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{f.name}: {said(f.type)}' for f in kind)}>"
    if pa.types.is_timestamp(kind):
        return "timestamptz" if kind.tz else "timestamp"
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision}, {kind.scale})"
    if pa.types.is_fixed_size_binary(kind):
        return f"fixed[{kind.byte_width}]"
    return NAMES.get(str(iceberg_type(pa.field("", kind))), str(kind))


NAMES = {
    "bool": "boolean",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "binary",
    "date32[day]": "date",
    "time64[us]": "time",
}


def difference(table: pa.Schema, ours: pa.Schema) -> str | None:
    """What keeps a table of columns ``table`` (its Iceberg schema as Arrow) from taking files
    of columns ``ours`` (None: nothing)."""
    for field in ours:
        if field.name not in table.names:
            return (
                f"column {field.name!r} that batchscore writes is not in the table (dropped or "
                "renamed)"
            )
        held = table.field(field.name)
        if said(held.type) != said(field.type):
            return (
                f"column {field.name!r} is {said(held.type)} in the table, but batchscore "
                f"writes {said(field.type)}"
            )
    for held in table:
        if held.name not in ours.names and not held.nullable:
            return f"column {held.name!r} of the table is required, and batchscore's files lack it"
    return None


def refusal(where: str, found: str, *, what: str = "") -> WriteError:
    """The refusal of a table whose columns do not take batchscore's files (``found``: why;
    ``what``: which files, where not those committed)."""
    return WriteError(
        f"{where}: the Iceberg table no longer takes batchscore's files{what}: {found}; "
        + WHAT_TO_DO
    )


def without_ids(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the field ids pyiceberg's reads attach (as every field's metadata):
    a file that carries field ids is refused by ``add_files``, which maps names instead."""
    return pa.schema([bare(field) for field in schema])


def bare(field: pa.Field) -> pa.Field:
    kind = field.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = pa.list_(bare(kind.value_field))
    elif pa.types.is_struct(kind):
        kind = pa.struct([bare(f) for f in kind])
    elif pa.types.is_map(kind):
        kind = pa.map_(bare(kind.key_field), bare(kind.item_field))
    return pa.field(field.name, kind, field.nullable)


def replace_columns(tx: Any, schema: pa.Schema) -> None:
    """Make the table's columns ``schema``'s, in its order, in pyiceberg's transaction ``tx``
    (for a table that holds no file: an append would keep the old columns and hide the new)."""
    held = tx.table_metadata.schema().as_arrow()
    stale = [f.name for f in held if f.name not in schema.names or not same(f, schema)]
    if stale:
        with tx.update_schema(allow_incompatible_changes=True) as update:
            for name in stale:
                update.delete_column(name)
    with tx.update_schema() as update:
        update.union_by_name(schema)
    with tx.update_schema() as update:
        update.move_first(schema.names[0])
        for before, name in zip(schema.names, schema.names[1:], strict=False):
            update.move_after(name, before)


def same(field: pa.Field, schema: pa.Schema) -> bool:
    """Whether ``schema`` holds ``field`` as the same Iceberg type."""
    return difference(pa.schema([field]), pa.schema([schema.field(field.name)])) is None
