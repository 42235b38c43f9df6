"""Iceberg tables for the tests of `batchscore.output.iceberg`: chunk files as batchscore writes
them, and what each reader (pyiceberg, DuckDB's ``iceberg_scan``, polars' ``scan_iceberg``)
reads of the table."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from duckdb_extensions import import_extension
from pyiceberg.table import StaticTable

from batchscore.output.iceberg import Table
from batchscore.output.iceberg_columns import fit
from batchscore.output.keys import keys_of, publish_keys
from batchscore.output.manifest import FileFacts, facts_of
from batchscore.storage.disk import LocalStore
from batchscore.storage.layout import chunk_key, part_name, shard_key

# the output's columns as batchscore makes them: Iceberg's own (vectors as lists, small
# integers widened) by `fit`
SCHEMA = pa.schema(
    [("id", pa.string()), ("label", pa.uint8()), ("scores", pa.list_(pa.float32(), 2))]
)
FITTED = fit(SCHEMA)


def key(shard: str, chunk: int = 0) -> str:
    return chunk_key(shard_key(shard), chunk)


def rows_of(ids: list[str], seed: int = 0) -> pa.Table:
    """Rows with these ids, scores made from their place (``seed`` shifts them)."""
    n = len(ids)
    scores = [[(i + seed) / 10, (i + seed) / 20] for i in range(n)]
    return pa.table({"id": ids, "label": [i % 3 for i in range(n)], "scores": scores}).cast(SCHEMA)


def write_chunk(
    out: Path, chunk: str, rows: pa.Table, *, keys: bool = True
) -> tuple[str, FileFacts]:
    """A chunk's data file as the committer writes it (fitted, a footer of batchscore's), and
    its keys (the ids) published: (key, facts), as `Table.append` takes them."""
    meta = {"batchscore.job": "unit", "batchscore.chunk": chunk}
    pq.write_table(
        rows.cast(fit(rows.schema)).replace_schema_metadata(meta), out / part_name(chunk)
    )
    if keys:
        publish_keys(LocalStore(out), chunk, keys_of(rows.cast(fit(rows.schema)), "id"))
    return chunk, facts_of(out / part_name(chunk))


def table_at(out: Path, **options: object) -> Table:
    out.joinpath("_batchscore").mkdir(parents=True, exist_ok=True)
    return Table(LocalStore(out), lineage={"batchscore.job": "unit"}, id_column="id", **options)


def duckdb_rows(where: str, columns: str = "id, scores") -> list[tuple]:
    """The table's rows as DuckDB's own Iceberg reader reads them (its extension and avro's
    from the duckdb-extension wheels: DuckDB alone downloads them on first use)."""
    con = duckdb.connect()
    for name in ("avro", "iceberg"):
        import_extension(name, con=con)
    con.execute("LOAD iceberg")
    return sorted(con.execute(f"select {columns} from iceberg_scan('{where}')").fetchall())


def read_all(out: Path, table: Table) -> list[tuple[str, list[float]]]:
    """(id, scores) of every row, sorted, as pyiceberg (through the catalog, and from the
    folder alone), polars and DuckDB read it: they must agree."""
    rows = table.loaded().refresh().scan(selected_fields=("id", "scores")).to_arrow()
    found = sorted(zip(rows["id"].to_pylist(), rows["scores"].to_pylist(), strict=True))
    static = StaticTable.from_metadata(str(out)).scan(selected_fields=("id", "scores"))
    arrow = static.to_arrow()
    assert sorted(zip(arrow["id"].to_pylist(), arrow["scores"].to_pylist(), strict=True)) == found
    frame = pl.scan_iceberg(table.loaded()).select("id", "scores").collect()
    assert sorted(frame.iter_rows()) == found
    assert [(i, list(s)) for i, s in duckdb_rows(str(out))] == found
    return found
