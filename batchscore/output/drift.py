"""One folder, one schema: the carried columns' types across shards and runs.

Every data file of a folder carries the id and `keep` columns each in one type, or readers
refuse the folder (polars: "data type mismatch for column id"). Once a folder holds committed
files their type is the folder's, and a shard's column is cast to it as its rows are written:

- where that type holds every value of the shard's (`batchscore.work.columns.holds`: int32
  into int64, float32 into float64, any text layout into string, microseconds into
  nanoseconds, a decimal into a wider one), as it is;
- where the two are of one kind but the folder's is narrower (`same_kind`: nanoseconds into
  microseconds, a decimal of another precision or scale, float64 into float32), each value
  checked (`cast_exactly`): by rows the diff checks them all before anything is retired
  (`check_values`: a value that does not fit refuses the run, naming the file, row and
  column); by shards as the rows are written (a value that does not fit fails its shard, and
  nothing of it is written);
- any other type (a string id where the folder holds int64, an integer where it holds
  booleans, an integer where it holds floats) refuses the run (`SchemaDriftError`) while it
  plans, before it retires, rewrites or un-commits anything, naming the column, the shard and
  both types.

Before the first commit the shards of one run settle the type among themselves: the narrowest
that holds every shard's (`common`: float32 and float64 give float64, decimal(3, 2) and
decimal(5, 1) decimal(6, 2)); a shard whose type has none in common with the others' fails
alone, as an unreadable shard does, and the others are scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscore.errors import InputDataError, OutputConflictError
from batchscore.storage.store import Store
from batchscore.work.columns import InexactCast, canonical, cast_exactly, common, holds, same_kind
from batchscore.work.units import Shard

TRIES = 3  # committed files whose schema is tried (a missing or damaged one is skipped)


class SchemaDriftError(OutputConflictError):
    """A carried column's type in the input is not one the folder's committed files hold
    exactly: writing it would give the folder files of two schemas, or lose values."""


@dataclass(frozen=True)
class Reference:
    """The carried columns' types later shards must fit, and where they come from: the
    folder's committed files (``folder``: a shard that does not fit refuses the run), or the
    first shard of this run (one that does not fit fails alone)."""

    schema: pa.Schema
    source: str
    folder: bool = False


def folder_reference(
    store: Store, committed: dict[str, dict[str, Any]], names: tuple[str, ...]
) -> Reference | None:
    """The types of the columns ``names`` as the folder's committed data files hold them
    (None before its first commit, or when no committed file can be read now: the run's
    shards settle them then, and a damaged file is the manifest's to report)."""
    for key in sorted(committed)[:TRIES]:
        file = committed[key]["file"]
        try:
            with store.open_input(file) as fh:
                schema = pq.read_schema(fh)
        except (OSError, ValueError, pa.ArrowException):
            continue
        if all(name in schema.names for name in names):
            where = f"the output folder's committed files ({store.where(file)})"
            return Reference(pa.schema([schema.field(n) for n in names]), where, folder=True)
    return None


def check_drift(shard: Shard, carried: pa.Schema, reference: Reference | None) -> Reference:
    """Check a shard's carried columns (``carried``, as its footer types them) against the
    ``reference``; return the reference later shards must fit (this shard's types where there
    was none, widened where this run's first shard set it)."""
    if reference is None:
        fields = [f.with_type(canonical(f.type)) for f in carried]
        return Reference(pa.schema(fields), shard.path)
    fields = []
    for ref in reference.schema:
        found = carried.field(ref.name).type
        if holds(ref.type, found) or (reference.folder and same_kind(ref.type, found)):
            fields.append(ref)  # one of a kind: each value is checked as it is cast
            continue
        if reference.folder:
            raise SchemaDriftError(
                f"{shard.path}: column {ref.name!r} is {found} here but {ref.type} in "
                f"{reference.source}, which cannot hold {found} values; one folder keeps one "
                "schema, so nothing was scored or retired. Write the column as "
                f"{ref.type} again, or run with --restart to score every row anew in the new "
                "type, or point [output].path at a new folder"
            )
        kind = common(ref.type, canonical(found))  # a column of nulls takes the other's type
        if kind is None:
            raise InputDataError(
                f"{shard.path}: column {ref.name!r} is {found} here but {ref.type} in "
                f"{reference.source}; output files must share one schema, so this shard is "
                "not scored"
            )
        fields.append(ref.with_type(canonical(kind)))
    return Reference(pa.schema(fields), reference.source)


def check_values(table: pa.Table, carried: pa.Schema, *, shard: Shard, rows: np.ndarray) -> None:
    """By rows, before anything is retired: `SchemaDriftError` for the first of ``table``'s
    rows (the shard's ``rows``) with a carried column's value that the folder's type
    (``carried``) would not hold exactly."""
    names = [f.name for f in carried if not holds(f.type, table.schema.field(f.name).type)]
    if not names:
        return
    try:
        cast_exactly(table.select(names), pa.schema([carried.field(n) for n in names]))
    except InexactCast as exc:
        row = f"row {int(rows[exc.row])}: " if exc.row >= 0 else ""
        kind = carried.field(exc.column).type
        raise SchemaDriftError(
            f"{shard.path}: {row}{exc}; the output folder holds {exc.column!r} as {kind}, "
            "and one folder keeps one schema, so nothing was scored or retired. Write the "
            f"column as {kind} again, or run with --restart to score every row anew in the "
            "new type, or point [output].path at a new folder"
        ) from None
