"""A Delta table's columns: batchscore's types as Delta holds them (`fit`), and whether the
table still takes batchscore's files: its columns against batchscore's.

A shared table evolves. A column another writer adds, nullable, is fine: batchscore's files
lack it, and every reader reads it as null in their rows (Delta's rule for a file without one
of the table's columns), so batchscore commits under the table's columns and never narrows
them again. A column batchscore writes that the table no longer has (dropped, renamed), has
with another type, or a column the table requires (not null) that batchscore's files lack,
is not: batchscore's files would not read as the table says. That is refused, naming the
column: at a run's start against the columns its committed files were written with, before
anything of the table changes, and again at each append with the files being added.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from batchscore.errors import JobError, WriteError
from batchscore.output.format import WHAT_TO_DO

WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def fields_of(schema: Any) -> dict[str, dict[str, Any]]:
    """A Delta schema's (`deltalake.Schema`) fields by name, as the log's JSON has them."""
    return {f["name"]: f for f in json.loads(schema.to_json())["fields"]}


def delta_fields(schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """An Arrow schema's fields as Delta would hold them."""
    from deltalake import Schema

    return fields_of(Schema.from_arrow(schema))


def difference(table: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]]) -> str | None:
    """What keeps a table of columns ``table`` from taking files of columns ``ours`` (None:
    nothing; both as `fields_of` gives them)."""
    for name, field in ours.items():
        held = table.get(name)
        if held is None:
            return (
                f"column {name!r} that batchscore writes is not in the table (dropped or renamed)"
            )
        if canonical(held["type"]) != canonical(field["type"]):
            return (
                f"column {name!r} is {said(held['type'])} in the table, but batchscore writes "
                f"{said(field['type'])}"
            )
    for name, held in table.items():
        if name not in ours and not held.get("nullable", True):
            return f"column {name!r} of the table is not nullable, and batchscore's files lack it"
    return None


def check(table: Any, ours: pa.Schema | None, where: str, *, what: str = "") -> None:
    """Refuse (`WriteError`) a table (`deltalake.DeltaTable`) whose columns no longer take
    files of columns ``ours`` (None: nothing to check against; ``what`` says whose)."""
    if table is None or ours is None:
        return
    found = difference(fields_of(table.schema()), delta_fields(ours))
    if found is not None:
        raise refusal(where, found, what=what)


def refusal(where: str, found: str, *, what: str = "") -> WriteError:
    """The refusal of a table whose columns do not take batchscore's files (``found``: why;
    ``what``: which files, where not those committed)."""
    return WriteError(
        f"{where}: the Delta table no longer takes batchscore's files{what}: {found}; " + WHAT_TO_DO
    )


def canonical(kind: Any) -> str:
    return json.dumps(kind, sort_keys=True)


def said(kind: Any) -> str:
    """A Delta type as a person reads it: ``string``, ``array<float>``, ``struct<a: long>``."""
    if isinstance(kind, str):
        return kind
    if kind.get("type") == "array":
        return f"array<{said(kind['elementType'])}>"
    if kind.get("type") == "map":
        return f"map<{said(kind['keyType'])}, {said(kind['valueType'])}>"
    if kind.get("type") == "struct":
        return f"struct<{', '.join(f['name'] + ': ' + said(f['type']) for f in kind['fields'])}>"
    return json.dumps(kind)


def fit(schema: pa.Schema) -> pa.Schema:
    """The output schema as a Delta table holds it: fixed-size lists as lists, unsigned
    integers widened (a uint64 column has no Delta type and is refused); metadata kept."""
    return pa.schema([field.with_type(delta_type(field)) for field in schema], schema.metadata)


def delta_type(field: pa.Field) -> pa.DataType:
    """A column's type as Delta holds it (nested types converted throughout)."""
    kind = field.type
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        return pa.list_(field.with_type(delta_type(kind.value_field)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(delta_type(f)) for f in kind])
    if kind == pa.uint64():
        raise JobError(
            f'[output].format = "delta": column {field.name!r} is uint64, which Delta Lake '
            "cannot hold; cast it in the input, or write Parquet"
        )
    return WIDER.get(kind, kind)
