"""Another writer of a Delta table, with deltalake's own calls, and what readers read of it:
for the neighbours' tests (`test_delta_neighbours.py`) and the increments state machine."""

from __future__ import annotations

from pathlib import Path

import deltalake
import duckdb
import polars as pl
import pyarrow as pa
from duckdb_extensions import import_extension


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
