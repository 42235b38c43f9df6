"""A Delta table's chunk keys: each committed chunk's ids (and, by rows, row hashes), kept under
``_batchscore/keys/`` beside its commit record.

A table is shared: another writer may rewrite a chunk's data file into files of its own
(OPTIMIZE, Z-order, DELETE) and vacuum the old one away. The chunk's rows are then the
table's, in files batchscore did not write, and its keys are the only account of which rows
came from it. With them batchscore still knows which rows are committed (the by-rows diff
reads them in place of the file, row for row in the file's order), and takes a chunk's rows
out of the table wherever they now lie, by a Delta merge on the id and the hash, when its
shard leaves or changes, a row is edited or deleted, or at a ``--restart``
(`batchscore.output.delta.Table`).

A chunk's keys are published (an Arrow IPC file, staged and renamed) before its rows join the
table, so every chunk the table ever held has them; they go once the chunk is out of it. A
job without an id has none: rows no column names cannot be told apart once another writer
mixed them with its own. Their schema's metadata holds the columns the chunk's data file was
written with: what the table must still take (`batchscore.output.delta_columns`), however
long ago the file itself was vacuumed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.ipc as ipc

from batchscore.errors import write_error
from batchscore.job.sections import ROW_HASH
from batchscore.storage.layout import KEYS, keys_key, keys_name, part_key, staged_name
from batchscore.storage.store import Store

COLUMNS = b"batchscore.columns"  # the data file's columns, an Arrow schema serialized


def key_columns(schema: pa.Schema, id_column: str | None) -> list[str]:
    """The columns that name a row of a data file of ``schema``: the id, and by rows its hash
    (none without an id)."""
    if id_column is None or id_column not in schema.names:
        return []
    return [id_column, *([ROW_HASH] if ROW_HASH in schema.names else [])]


def keys_of(
    rows: pa.Table, id_column: str | None, *, written: pa.Schema | None = None
) -> pa.Table | None:
    """A data file's keys, from its ``rows`` (their key columns at least): the key columns,
    and the file's columns (``written``; else the rows') in the metadata. None: no id."""
    columns = key_columns(rows.schema, id_column)
    if not columns:
        return None
    whole = (written or rows.schema).remove_metadata().serialize().to_pybytes()
    return rows.select(columns).replace_schema_metadata({COLUMNS: whole})


def publish_keys(store: Store, key: str, keys: pa.Table, *, durable: bool = True) -> None:
    """Write chunk ``key``'s keys whole, replacing any (``durable=False``: a later barrier of
    `KEYS` makes the rename durable); a failure is a `WriteError` naming the file."""
    rel = keys_name(key)
    local = store.staging / staged_name(rel, os.getpid())
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, keys.schema) as writer:
        writer.write_table(keys)
    try:
        store.prepare(KEYS)
        store.stage(local, sink.getvalue())
        store.publish(local, rel, durable=durable)
    except OSError as exc:
        local.unlink(missing_ok=True)
        raise write_error(store.where(rel), exc) from exc


def read_keys(store: Store, key: str) -> pa.Table | None:
    """Chunk ``key``'s keys, or None where there are none to read (never written, gone, or
    not an Arrow file: they prove nothing, and a caller that needs them refuses)."""
    rel = keys_name(key)
    if store.size(rel) is None:
        return None
    try:
        with store.open_input(rel) as fh:
            return ipc.open_file(fh).read_all()
    except (OSError, pa.ArrowException):
        return None


def written_columns(keys: pa.Table) -> pa.Schema | None:
    """The columns the chunk's data file was written with, as its keys recall them."""
    found = (keys.schema.metadata or {}).get(COLUMNS)
    if found is None:
        return None
    try:
        return ipc.read_schema(pa.py_buffer(found))
    except pa.ArrowException:
        return None


def kept_chunks(store: Store) -> set[str]:
    """The chunks whose keys are kept (a table's, Delta's or Iceberg's)."""
    return {k for name in store.names(KEYS) if (k := keys_key(f"{KEYS}/{name}"))}


def drop_chunk_keys(store: Store, keys: Iterable[str]) -> None:
    """Delete chunks' keys (a missing one is fine); a failure names the file."""
    for key in keys:
        try:
            store.delete(keys_name(key))
        except OSError as exc:
            raise write_error(store.where(keys_name(key)), exc, doing="remove") from exc


def chunks_named(rels: Iterable[str]) -> list[str]:
    """The chunks whose data files or keys ``rels`` name (other names are no chunk's)."""
    keys = [keys_key(rel) if "/" in rel else part_key(rel) for rel in rels]
    return [k for k in keys if k is not None]
