"""The output formats the folder's suites run over, and what each table format's readers read.

A suite that holds for every format takes its list from `FORMATS`; where a guarantee is a
table's (its own log names exactly the committed chunks' files), `TABLES`. `table_rows` is
what a table's readers read of batchscore's rows, once they agree and the table's log is
checked against the commit records: Delta's (`tests.output.tiny.delta_rows`) and Iceberg's
(`iceberg_rows`, here)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import duckdb
import polars as pl
import pyarrow as pa
from duckdb_extensions import import_extension

from batchscore.output.checkpoint import Checkpoint
from batchscore.output.iceberg import CHUNK
from batchscore.output.iceberg_catalog import IDENTIFIER, NAME, identifier_of
from batchscore.storage.layout import CATALOG, part_name
from tests.output.tiny import delta_rows

FORMATS = ["parquet", "delta", "iceberg"]  # `[output].format`: every entry of the table
TABLES = ["delta", "iceberg"]  # those that are tables: a log of their own names the files


def table_format(out: Path) -> str | None:
    """Which table the folder at ``out`` is (by its log's folder), None: a plain folder."""
    if (out / "_delta_log").is_dir():
        return "delta"
    if (out / "metadata").is_dir():
        return "iceberg"
    return None


def iceberg_table(out: Path) -> Any:
    """The Iceberg table at ``out`` as another reader (or writer) opens it: through the
    folder's own SQL catalog (`_batchscore/iceberg.db`), with pyiceberg's own calls."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        NAME,  # a SQL catalog keeps its tables by its name
        uri=f"sqlite:///{out / CATALOG}",
        warehouse=str(out),
        **{"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"},
    )
    return catalog.load_table(identifier_of(IDENTIFIER))


def iceberg_read(out: Path, columns: tuple[str, ...] = ("*",)) -> pa.Table:
    """``columns`` (all: "*") of every row of the Iceberg table at ``out``, as pyiceberg
    reads it."""
    return iceberg_table(out).scan(selected_fields=columns).to_arrow()


def iceberg_agreed(out: Path, columns: tuple[str, ...]) -> list[tuple]:
    """``columns`` of every row of the Iceberg table at ``out``, sorted, as pyiceberg (through
    the catalog), polars' ``scan_iceberg`` and DuckDB's ``iceberg_scan`` (of the current
    metadata file: the folder's version hint names the newest file batchscore committed, not
    another writer's) read them: they must agree."""
    table = iceberg_table(out)
    arrow = table.scan(selected_fields=columns).to_arrow()
    found = sorted(zip(*(arrow[c].to_pylist() for c in columns), strict=True))
    with warnings.catch_warnings():  # polars' own planner is another package: pyiceberg's
        warnings.filterwarnings("ignore", message="Iceberg scan planning")
        frame = pl.scan_iceberg(table).select(*columns).collect()
    assert sorted(frame.iter_rows()) == found
    assert duckdb_iceberg(table.metadata_location, columns) == found
    return found


def duckdb_iceberg(where: str, columns: tuple[str, ...]) -> list[tuple]:
    """``columns`` of the Iceberg table at ``where`` (a folder, by its version hint, or a
    metadata file), sorted, as DuckDB's ``iceberg_scan`` reads them (its extension and avro's
    from the duckdb-extension wheels: DuckDB alone downloads them on first use)."""
    query = f"select {', '.join(columns)} from iceberg_scan('{where}')"
    return sorted(iceberg_duckdb().execute(query).fetchall())


@functools.cache
def iceberg_duckdb() -> duckdb.DuckDBPyConnection:
    """One DuckDB connection with the Iceberg extension loaded, for every read of a test
    session (loading it costs about half a second; a read, milliseconds)."""
    con = duckdb.connect()
    for name in ("avro", "iceberg"):
        import_extension(name, con=con)
    con.execute("LOAD iceberg")
    return con


def iceberg_rows(out: Path) -> list[tuple[str, int]]:
    """The (id, `_row_hash`) pairs of the Iceberg table at ``out``, sorted, as pyiceberg,
    polars' ``scan_iceberg`` and DuckDB's ``iceberg_scan`` each read them (they must agree,
    and DuckDB and pyiceberg from the folder alone too, by its version hint), once the
    table's live files are checked to be exactly the committed chunks' files (no delete file
    against any), each committed chunk's version (its table property) odd."""
    from pyiceberg.table import StaticTable

    table = iceberg_table(out)
    committed = Checkpoint(out).committed()
    tasks = list(table.scan().plan_files()) if table.current_snapshot() else []
    assert {t.file.file_path for t in tasks} == {str(out / part_name(k)) for k in committed}
    assert not any(t.delete_files for t in tasks)
    assert all(int(table.properties[CHUNK + key]) % 2 == 1 for key in committed)
    found = iceberg_agreed(out, ("id", "_row_hash"))
    static = StaticTable.from_metadata(str(out)).scan(selected_fields=("id", "_row_hash"))
    alone = static.to_arrow()
    pairs = zip(alone["id"].to_pylist(), alone["_row_hash"].to_pylist(), strict=True)
    assert sorted(pairs) == found
    assert duckdb_iceberg(str(out), ("id", "_row_hash")) == found
    return found


# each table format's `*_rows`: (id, `_row_hash`) pairs, as its every reader reads them
READERS: dict[str, Callable[[Path], list[tuple[str, int]]]] = {
    "delta": delta_rows,
    "iceberg": iceberg_rows,
}


def table_rows(out: Path, fmt: str | None = None) -> list[tuple[str, int]]:
    """The (id, `_row_hash`) pairs of the table at ``out`` (of format ``fmt``, else as its
    log's folder says), sorted, as each of its readers reads them (see `READERS`)."""
    return READERS[fmt or table_format(out) or "none"](out)


def table_ids(out: Path, fmt: str, column: str = "id") -> list[str]:
    """The ids (of ``column``) one reader of the table reads through its log (deltalake's,
    pyiceberg's), sorted, nothing checked against the commit records (a run killed midway
    may leave the log ahead of them); an id held twice fails."""
    if fmt == "delta":
        table = deltalake.DeltaTable(str(out)).to_pyarrow_table(columns=[column])
    else:
        table = iceberg_read(out, (column,))
    ids = table[column].to_pylist()
    assert len(set(ids)) == len(ids), f"an id is in the {fmt} table twice"
    return sorted(ids)
