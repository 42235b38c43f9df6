"""Rows of batchscore's taken out of an Iceberg table's files by their keys, wherever they lie.

Once another writer compacted or rewrote a chunk's file, its rows are in files of that
writer's, mixed with others. Iceberg has no merge in pyiceberg, and pyiceberg's ``delete``
takes a filter expression, which cannot say "these (id, hash) pairs" for thousands of rows,
nor match exactly without a pair's values crossing with another's. So the files that may
hold the rows are found by their ids (the manifests' column bounds prune the rest), each is
read as the table reads it (delete files applied, columns as the table has them), its rows
that equal a row of the keys exactly are dropped (a join: nulls never match, so another
writer's rows, with no row hash of batchscore's, are never taken by rows), and the file is
swapped for a new file of its other rows in one overwrite snapshot (`Table.delete_keys`).
The new file is batchscore's but no chunk's: it lives under ``data/`` as pyiceberg's and
Spark's own files do, named by a fresh uuid, its footer carrying the lineage.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchscore.errors import write_error
from batchscore.output.iceberg_columns import without_ids
from batchscore.storage.store import Store

REWRITTEN = "data"  # where the files of rows batchscore took out of others' files go


def files_without(table: Any, source: pa.Table) -> dict[str, pa.Table]:
    """Each data file of ``table`` (a `pyiceberg.table.Table`) holding a row whose columns
    equal a row of ``source``: its rows as the table reads them, less those."""
    from pyiceberg.expressions import AlwaysTrue, In
    from pyiceberg.io.pyarrow import ArrowScan

    name = source.column_names[0]
    ids = {v for v in source.column(name).to_pylist() if v is not None}
    changed = {}
    for task in table.scan(row_filter=In(name, ids)).plan_files():
        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        rows = scan.to_table([task])
        hit = matches(rows, source)
        if pc.any(hit).as_py():
            changed[task.file.file_path] = rows.filter(pc.invert(hit))
    return changed


def matches(rows: pa.Table, source: pa.Table) -> pa.Array:
    """Which of ``rows`` equal a row of ``source`` in ``source``'s columns (nulls never
    match)."""
    names = source.column_names
    at = pa.array(range(rows.num_rows), pa.int64())
    left = rows.select(names).append_column("__at", at)
    right = source.cast(pa.schema([rows.schema.field(n).with_nullable(True) for n in names]))
    hits = left.join(right.group_by(names).aggregate([]), names, join_type="left semi")
    return pc.is_in(at, value_set=hits.column("__at").combine_chunks())


def write_rows(store: Store, uri: str, rows: pa.Table, lineage: dict[str, str]) -> str:
    """Publish ``rows`` as a data file of their own under `REWRITTEN` in the output at
    ``uri`` (staged, synced, renamed or uploaded whole); returns it as the table names it."""
    rel = f"{REWRITTEN}/batchscore-{uuid.uuid4().hex}.parquet"
    local = store.staging / rel.replace("/", "_")
    rows = rows.cast(without_ids(rows.schema)).replace_schema_metadata(lineage)
    try:
        store.prepare(REWRITTEN)
        pq.write_table(rows, local)
        store.sync(local)
        store.publish(local, rel)
    except OSError as exc:
        local.unlink(missing_ok=True)
        raise write_error(store.where(rel), exc) from exc
    return f"{uri}/{rel}"
