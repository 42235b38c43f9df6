"""A committed data file rewritten without the rows a retirement took (by rows, `increments`).

In a folder of Parquet files the file is rewritten in place: an intent naming the new file and
its new record, the file replaced atomically (a rename, or an object's upload), then the
record. The next start finds the file either as its old record says (nothing happened) or as
the intent says, and then writes the record (`Checkpoint.sweep`).

A Delta table's log names each file once, with its size, rows and statistics, so there a file
is never rewritten in place (and never through Delta's own ``delete``, which would write files
under Delta's names): the kept rows go to a new file under a new chunk key
(`batchscore.storage.layout.successor_key`), so the table's files and the committed chunks'
files stay one set. Its steps, each safe to cut off:

1. the intent: the new file, its record, and the record it replaces;
2. the new chunk's keys (`batchscore.output.keys`), then its file, published (fault point
   ``rewrite``);
3. one Delta transaction removes the old file and adds the new (`Table.rewrite`; fault point
   ``rewrite-table``);
4. the old chunk's rejected-rows list moves to the new chunk, and the new record is written
   (fault point ``rewrite-record``);
5. the old record, then the old file, are removed, and last the intent.

A kill after step 2 is finished by the next start (`finish_rewrites`, the steps from 3 on,
each of which does nothing where it is done already), since the new file is as the intent
says; a kill before it leaves the old record and file as they were, the intent is dropped, and
the next diff retires the same rows again. Delta readers see the old file's rows, then the new
file's, never both; the folder's records name both only between steps 4 and 5, until the
next start.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscore import faults
from batchscore.errors import write_error
from batchscore.output.checkpoint import RECORD_KEYS, Checkpoint
from batchscore.output.keys import keys_of, publish_keys
from batchscore.output.manifest import FileFacts, facts_of_bytes, problem
from batchscore.storage.layout import (
    DONE,
    REJECTED,
    intent_name,
    is_own_name,
    kept_name,
    part_name,
    record_name,
    rejected_name,
    staged_name,
    successor_key,
)
from batchscore.work.columns import int64s
from batchscore.work.row_errors import FIELD

log = logging.getLogger("batchscore")


def rewrite(
    ckpt: Checkpoint, record: dict[str, Any], retired: np.ndarray, *, folder: str
) -> dict[str, Any]:
    """Rewrite a committed data file without its ``retired`` rows (kept in ``folder``, the
    retirement's): in place, or under a new chunk key where the folder is a Delta table (see
    the module's note). Returns the new record."""
    store, file = ckpt.store, record["file"]
    table = store.read_table(file)
    keep = np.setdiff1d(np.arange(table.num_rows), retired, assume_unique=True)
    publish_bytes(ckpt, encoded(table.take(int64s(retired))), kept_name(folder + ".json", file))
    kept = table.take(int64s(keep))
    if ckpt.format.rewrites_in_place:
        return in_place(ckpt, record, kept, len(retired))
    return anew(ckpt, record, kept, len(retired), key=successor_key(record["chunk"], folder))


def in_place(
    ckpt: Checkpoint, record: dict[str, Any], kept: pa.Table, retired: int
) -> dict[str, Any]:
    """The file replaced at its own name, its record rewritten after it."""
    key, file = record["chunk"], record["file"]
    data = encoded(kept)
    facts = facts_of_bytes(data, kept.num_rows)
    new = renewed(record, kept, facts, retired)
    ckpt.intend([intent(key, file, facts, new)])
    publish_bytes(ckpt, data, file)
    faults.hit("rewrite")
    ckpt.write_json(record_name(key), new)
    ckpt.remove(intent_name(key))
    return new


def anew(
    ckpt: Checkpoint, record: dict[str, Any], kept: pa.Table, retired: int, *, key: str
) -> dict[str, Any]:
    """The kept rows as chunk ``key``'s file (its footer naming that chunk), swapped for the
    old one in the table and the records (`swap`)."""
    meta = {**(kept.schema.metadata or {}), b"batchscore.chunk": key.encode()}
    data = encoded(kept.replace_schema_metadata(meta))
    facts = facts_of_bytes(data, kept.num_rows)
    new = renewed(record, kept, facts, retired) | {"chunk": key, "file": part_name(key)}
    entry = intent(key, part_name(key), facts, new) | {"replaces": record}
    ckpt.intend([entry])
    keys = keys_of(kept, ckpt.format.id_column)
    if keys is not None:  # before the file: every chunk the table ever holds has its keys
        publish_keys(ckpt.store, key, keys)
    publish_bytes(ckpt, data, part_name(key))
    faults.hit("rewrite")
    swap(ckpt, entry)
    return new


def swap(ckpt: Checkpoint, entry: dict[str, Any]) -> None:
    """Steps 3 to 5 of the module's note, for a rewrite whose new file is published; each
    does nothing where a killed run did it already."""
    new, old = entry["record"], entry["replaces"]
    ckpt.format.rewrite(old["chunk"], new["chunk"], size=new["size"], rows=new["rows"])
    faults.hit("rewrite-table")
    rejected = rejected_name(old["chunk"])
    if ckpt.store.size(rejected) is not None:
        ckpt.move(rejected, rejected_name(new["chunk"]))
        ckpt.barrier(REJECTED)
    ckpt.write_many({record_name(new["chunk"]): new})
    faults.hit("rewrite-record")
    ckpt.forget(old["chunk"], old)
    ckpt.remove(intent_name(new["chunk"]))


def finish_rewrites(ckpt: Checkpoint) -> None:
    """Finish the rewrites under a new key a killed run left (their intents, which
    `Checkpoint.sweep` leaves): on, where the new file is as its intent says or its record is
    written; else the intent is dropped, the old chunk untouched (see the module's note)."""
    for rel, entries in ckpt.intent_files():
        rewrites = [entry for entry in entries if "replaces" in entry]
        for entry in rewrites:
            if not well_formed(entry):
                log.warning("%s: not a rewrite batchscore wrote; dropped", ckpt.store.where(rel))
            elif (
                ckpt.store.size(record_name(entry["chunk"])) is not None
                or problem(ckpt.store, entry) is None
            ):
                log.info("finishing the rewrite of %s, cut off", ckpt.store.where(entry["file"]))
                swap(ckpt, entry)
        if rewrites:
            ckpt.remove(rel)


def well_formed(entry: dict[str, Any]) -> bool:
    """Whether a rewrite's intent is one batchscore writes: both records whole, each naming
    its chunk's own file, the new one the intent's."""
    new, old = entry.get("record"), entry.get("replaces")
    return (
        all(isinstance(r, dict) and all(k in r for k in RECORD_KEYS) for r in (new, old))
        and all(
            is_own_name(DONE, f"{r['chunk']}.json") and r["file"] == part_name(r["chunk"])
            for r in (new, old)
        )
        and new["chunk"] == entry["chunk"]
        and new["file"] == entry["file"]
    )


def renewed(
    record: dict[str, Any], kept: pa.Table, facts: FileFacts, retired: int
) -> dict[str, Any]:
    """A rewritten file's record: its old one with the new file's facts, rows and count of
    rows retired from it so far."""
    return {
        **record,
        **facts.as_record(),
        "committed_at": time.time(),
        "bad_rows": bad_rows(kept),
        "retired": record.get("retired", 0) + retired,
    }


def intent(key: str, file: str, facts: FileFacts, record: dict[str, Any]) -> dict[str, Any]:
    """A rewrite's intent: the file it publishes (as any intent names one) and the record
    that commits it, which the next start writes if the file it finds is this one."""
    return {"chunk": key, "file": file, **facts.as_record(), "record": record}


def bad_rows(table: pa.Table) -> int:
    """Rows written with an error (`on_error = "skip"`)."""
    if FIELD.name not in table.column_names:
        return 0
    return table.num_rows - table.column(FIELD.name).null_count


def encoded(table: pa.Table) -> pa.Buffer:
    """A table as a Parquet file's bytes, its schema's metadata (the footer) kept."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def publish_bytes(ckpt: Checkpoint, data: pa.Buffer, rel: str) -> None:
    """Stage ``data`` and publish it as ``rel``, replacing what is there, atomically."""
    local = ckpt.tmp_dir / staged_name(rel, os.getpid())
    try:
        ckpt.store.stage(local, data)
        ckpt.store.publish(local, rel)
    except OSError as exc:
        local.unlink(missing_ok=True)
        raise write_error(ckpt.store.where(rel), exc) from exc
