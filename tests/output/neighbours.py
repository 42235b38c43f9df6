"""Another writer of a table, with its library's own calls, and what readers read of it: of a
Delta table (deltalake's calls; for `test_delta_neighbours.py` and the increments state
machine), and of an Iceberg table (pyiceberg's, through the folder's own catalog; for the
Iceberg jobs' tests and the machine)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import deltalake
import duckdb
import polars as pl
import pyarrow as pa
from duckdb_extensions import import_extension

from tests.output.formats import iceberg_table


def table_rows(out: Path) -> list[tuple[str, list[float]]]:
    """(id, scores) of every row of the table, sorted, as deltalake, polars and DuckDB read
    it: they must agree."""
    table = deltalake.DeltaTable(str(out)).to_pyarrow_table(columns=["id", "scores"])
    found = sorted(zip(table["id"].to_pylist(), table["scores"].to_pylist(), strict=True))
    frame = pl.read_delta(str(out), columns=["id", "scores"])
    assert sorted(frame.iter_rows()) == found
    con = duckdb.connect()
    import_extension("delta", con=con)
    con.execute("LOAD delta")
    assert sorted(con.execute(f"select id, scores from delta_scan('{out}')").fetchall()) == found
    return found


def append_foreign(
    out: Path, ids: tuple[str, ...] = ("f-0", "f-1")
) -> list[tuple[str, list[float]]]:
    """Another writer appends rows of its own, with these ids (no row hash of batchscore's):
    copies of the table's first rows."""
    dt = deltalake.DeltaTable(str(out))
    rows = dt.to_pyarrow_table().slice(0, len(ids))
    rows = rows.set_column(rows.schema.get_field_index("id"), "id", pa.array(list(ids)))
    if "_row_hash" in rows.column_names:
        at = rows.schema.get_field_index("_row_hash")
        rows = rows.set_column(at, "_row_hash", pa.nulls(len(ids), pa.int64()))
    deltalake.write_deltalake(str(out), rows, mode="append")
    return list(zip(rows["id"].to_pylist(), rows["scores"].to_pylist(), strict=True))


def neighbour(out: Path, operation: str) -> None:
    """Another writer's maintenance of the table, with deltalake's own calls."""
    dt = deltalake.DeltaTable(str(out))
    if operation == "compact":
        dt.optimize.compact()
    elif operation == "z_order":
        dt.optimize.z_order(["id"])
    elif operation == "vacuum":  # compaction, then the old files deleted from disk
        dt.optimize.compact()
        deltalake.DeltaTable(str(out)).vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=False
        )
    elif operation == "add_column":
        dt.alter.add_columns([deltalake.Field("note", "string", nullable=True)])
    else:
        raise ValueError(operation)


def iceberg_neighbour(out: Path, operation: str) -> None:
    """Another writer's maintenance of the Iceberg table at ``out``, with pyiceberg's own calls
    through the folder's catalog: a compaction (pyiceberg has no ``rewrite_data_files``: an
    ``overwrite`` of the whole table with its own rows, every file of batchscore's replaced by
    files of the writer's under ``data/``), every snapshot but the current expired, or a
    nullable column added."""
    table = iceberg_table(out)
    if operation == "compact":
        table.overwrite(table.scan().to_arrow())
    elif operation == "expire":
        now = datetime.now() + timedelta(seconds=1)
        table.maintenance.expire_snapshots().older_than(now).commit()
    elif operation == "add_column":
        from pyiceberg.types import StringType

        with table.update_schema() as update:
            update.add_column("note", StringType())
    else:
        raise ValueError(operation)


def iceberg_append_foreign(
    out: Path, ids: tuple[str, ...] = ("f-0", "f-1")
) -> list[tuple[str, list[float]]]:
    """Another writer appends rows of its own to the Iceberg table at ``out``, with these ids
    (no row hash of batchscore's): copies of the table's first rows."""
    table = iceberg_table(out)
    rows = table.scan(limit=len(ids)).to_arrow().slice(0, len(ids))
    rows = rows.set_column(rows.schema.get_field_index("id"), "id", pa.array(list(ids)))
    if "_row_hash" in rows.column_names:
        at = rows.schema.get_field_index("_row_hash")
        rows = rows.set_column(at, "_row_hash", pa.nulls(len(ids), pa.int64()))
    table.append(rows.cast(table.schema().as_arrow()))
    return list(zip(rows["id"].to_pylist(), rows["scores"].to_pylist(), strict=True))
