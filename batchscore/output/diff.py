"""The diff of row increments: which input rows are still to score, which committed rows retire.

With `[input].increments = "rows"` a row is its id and its hash (`batchscore.work.row_hash`).
The diff reads only what it needs: the input's id column and the columns the hash covers (and
those `where` tests), and the committed files' id and `_row_hash` columns, by Parquet
projection. An input row whose (id, hash) is committed is done wherever it now lies (a shard
renamed, split, merged or compacted); one whose id is committed with another hash was edited:
it is scored and the old row retires; a committed row whose id left the input retires too.

It streams: each side goes through in batches and is split by its id's hash into parts of at
most `PART_ROWS` rows per side, kept in memory when there is one part and spilled to Arrow IPC
files in the local staging folder when there are more; each part is then joined on its own
(polars). Memory is bounded by a part, whatever the number of rows (`scripts/
bench_increments.py` measures the peak over 10 million). What comes out is compact: the rows to
score as (shard, row) and those to retire as (file, row), 8 bytes each.

Duplicate ids among the input rows that pass `where`, and null ids, are the input's error
(`DuplicateIdError`, naming the files and rows), never a row scored twice.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from batchscore.errors import InputDataError
from batchscore.job.sections import ROW_HASH, InputConfig
from batchscore.output.drift import check_values
from batchscore.storage.store import Store
from batchscore.work.columns import normalized
from batchscore.work.row_hash import hashed_columns, row_hashes, value_words
from batchscore.work.shards import check_unchanged, open_shard, read_error
from batchscore.work.units import Shard

PART_ROWS = 1 << 20  # rows of each side joined at once
BATCH_ROWS = 1 << 16  # rows read at a time
SHIFT = 40  # a (source, row) pair packed in one int64: source << SHIFT | row
NAMED = 5  # duplicates named in a message, at most


class DuplicateIdError(InputDataError):
    """Two input rows (that pass `where`) share an id, or a row has none: a row's id must name
    it alone, or its score could not be told from another's."""


@dataclass
class RowDiff:
    """What the diff found: the rows to score and retire, and counts for the report."""

    score: dict[int, np.ndarray] = field(default_factory=dict)  # shard index -> its rows
    retire: dict[str, np.ndarray] = field(default_factory=dict)  # chunk key -> its file's rows
    passing: dict[int, int] = field(default_factory=dict)  # shard index -> rows past `where`
    input_rows: int = 0  # rows that pass `where`
    filtered: int = 0
    committed: int = 0  # committed rows read
    unchanged: int = 0  # input rows committed already
    new: int = 0  # input rows whose id is not committed
    changed: int = 0  # input rows committed with another hash: scored, the old one retired
    deleted: int = 0  # committed rows whose id is no longer input
    twice: int = 0  # committed rows whose (id, hash) another committed row holds too
    retired: int = 0  # committed rows to retire: changed, deleted, or held twice
    failures: list[dict[str, str]] = field(default_factory=list)  # shards that could not be read

    @property
    def to_score(self) -> int:
        return self.new + self.changed

    @property
    def to_retire(self) -> int:
        return self.retired

    def counts(self) -> dict[str, int]:
        """The diff's figures, as the run report and `plan` and `status` give them."""
        return {
            "input_rows": self.input_rows,
            "committed_rows": self.committed,
            "unchanged": self.unchanged,
            "new": self.new,
            "changed": self.changed,
            "deleted": self.deleted,
            "committed_twice": self.twice,
            "to_score": self.to_score,
            "to_retire": self.to_retire,
        }


def rows_line(counts: dict[str, int]) -> str:
    """By rows, what the next run does: rows to score (new, edited) and to retire."""
    return (
        f"by rows: {counts['to_score']:,} to score ({counts['new']:,} new, {counts['changed']:,} "
        f"edited), {counts['to_retire']:,} committed row(s) to retire ({counts['deleted']:,} no "
        f"longer input), {counts['unchanged']:,} unchanged"
    )


def int64s(values: np.ndarray) -> pa.Array:
    """An int64 Arrow array from numpy's buffer (`pa.array` over numpy first asks whether it
    is pandas, which imports pandas)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def unpacked(values: np.ndarray) -> dict[int, np.ndarray]:
    """Packed (source, row) pairs as sorted rows per source."""
    values = np.sort(values)
    sources = values >> np.int64(SHIFT)
    cuts = np.flatnonzero(np.diff(sources)) + 1
    rows = values & np.int64((1 << SHIFT) - 1)
    pairs = zip(np.split(sources, cuts), np.split(rows, cuts), strict=True)
    return {int(source[0]): found for source, found in pairs if len(source)}


class Parts:
    """One side of the diff split by its ids' hash, in memory (one part) or in IPC files."""

    def __init__(self, count: int, folder: Path, name: str) -> None:
        self.count, self.tables = count, [[] for _ in range(count)]
        self.files = [folder / f"diff-{name}-{i}.arrow" for i in range(count)] if count > 1 else []
        self.writers: list[Any] = [None] * len(self.files)
        self.id_type: pa.DataType | None = None  # the first table's, for parts left empty

    def add(self, table: pa.Table) -> None:
        self.id_type = self.id_type or table.schema.field("id").type
        if self.count == 1:
            self.tables[0].append(table)
            return
        part = (value_words(table.column("id").combine_chunks()) % np.uint64(self.count)).astype(
            np.int64
        )
        for i in np.unique(part):
            chosen = table.take(int64s(np.flatnonzero(part == i)))
            if self.writers[i] is None:
                self.writers[i] = ipc.new_file(str(self.files[i]), chosen.schema)
            self.writers[i].write_table(chosen)

    def part(self, i: int, schema: pa.Schema) -> pa.Table:
        if self.count == 1:
            return pa.concat_tables(self.tables[0]) if self.tables[0] else schema.empty_table()
        if self.writers[i] is None:
            return schema.empty_table()
        self.writers[i].close()
        self.writers[i] = None
        with ipc.open_file(str(self.files[i])) as reader:
            table = reader.read_all()
        self.files[i].unlink()
        return table

    def close(self) -> None:
        for writer, path in zip(self.writers, self.files, strict=True):
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.close()
            path.unlink(missing_ok=True)


def row_diff(
    inp: InputConfig,
    *,
    kinds: dict[str, str],
    shards: list[Shard],
    store: Store,
    committed: dict[str, dict[str, Any]],
    carried: pa.Schema | None = None,
    unread: bool = False,
) -> RowDiff:
    """The diff of ``shards`` (those the plan could read) against the ``committed`` records'
    data files in ``store``; each carried column's values must fit its type in ``carried``
    (the plan's: the folder's, `batchscore.output.drift.check_values`). Parts spill to a
    temporary folder of this machine's (never the output folder: `status` and `plan` write
    nothing there), removed on the way out; a shard that cannot be read (`InputDataError`)
    is left out and listed in ``failures``. With one left out, or ``unread`` (some shard's
    footer failed the plan), only new ids are scored and nothing retires."""
    diff = RowDiff()
    hashed = hashed_columns(inp, kinds)
    keys = sorted(committed)
    total_in = sum(read_rows_count(s) for s in shards)
    count = max(1, -(-max(total_in, sum(r["rows"] for r in committed.values())) // PART_ROWS))
    scratch = Path(tempfile.mkdtemp(prefix="batchscore-diff-"))
    sides = Parts(count, scratch, "input"), Parts(count, scratch, "output")
    try:
        for shard in shards:
            try:
                for table in input_keys(shard, inp, kinds, hashed, diff, carried):
                    sides[0].add(table)
            except DuplicateIdError:
                raise
            except InputDataError as exc:  # its rows already added are left out of the join
                diff.failures.append({"shard": shard.path, "error": str(exc)})
        for index, key in enumerate(keys):
            table = committed_keys(store, committed[key]["file"], inp.id, index)
            diff.committed += table.num_rows
            sides[1].add(table)
        id_type = sides[0].id_type or sides[1].id_type or pa.int64()
        found_score, found_retire = [], []
        for i in range(count):
            failed = {s.index for s in shards if s.path in {f["shard"] for f in diff.failures}}
            score, retire = join(
                sides[0].part(i, key_schema(id_type, "shard")),
                sides[1].part(i, key_schema(id_type, "file")),
                diff,
                shards,
                failed=failed,
                partial=bool(failed) or unread,
            )
            found_score.append(score)
            found_retire.append(retire)
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if diff.failures or unread:  # what left cannot be told from a shard not read (`join`)
        diff.changed = diff.deleted = diff.twice = diff.retired = 0
    diff.score = unpacked(np.concatenate(found_score)) if found_score else {}
    retire = unpacked(np.concatenate(found_retire)) if found_retire else {}
    diff.retire = {keys[i]: rows for i, rows in retire.items()}
    return diff


def read_rows_count(shard: Shard) -> int:
    pf = open_shard(shard)
    try:
        return pf.metadata.num_rows
    finally:
        pf.close()


def key_schema(id_type: pa.DataType, source: str) -> pa.Schema:
    return pa.schema(
        [("id", id_type), ("h", pa.int64()), (source, pa.int64()), ("row", pa.int64())]
    )


def input_keys(
    shard: Shard,
    inp: InputConfig,
    kinds: dict[str, str],
    hashed: tuple[str, ...],
    diff: RowDiff,
    carried: pa.Schema | None = None,
) -> Iterator[pa.Table]:
    """A shard's rows as (id, hash, shard, row), `where` applied, a batch at a time, each
    carried column's values checked against its type in ``carried``; the shard must be the
    file the run listed once its rows are read (`check_unchanged`)."""
    row_filter = inp.row_filter
    columns = list(dict.fromkeys([inp.id, *hashed, *(row_filter.columns if row_filter else ())]))
    pf = open_shard(shard)
    offset, passing = 0, 0
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
            table = normalized(pa.Table.from_batches([batch]))
            rows = np.arange(offset, offset + table.num_rows, dtype=np.int64)
            if row_filter is not None:
                keep = row_filter.keep_in(table, shard.path, offset)
                diff.filtered += table.num_rows - len(keep)
                table, rows = table.take(int64s(keep)), rows[keep]
            offset += batch.num_rows
            ids = table.column(inp.id)
            if ids.null_count:
                first = int(rows[np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0]])
                raise DuplicateIdError(
                    f"{shard.path}: row {first}: [input].id {inp.id!r} is null; with increments "
                    '= "rows" every row needs an id of its own: fill it in, or filter the row '
                    "out with [input].where"
                )
            if carried is not None:
                check_values(table, carried, shard=shard, rows=rows)
            passing += table.num_rows
            yield pa.table(
                {
                    "id": ids,
                    "h": int64s(row_hashes(table, hashed).view(np.int64)),
                    "shard": int64s(np.full(table.num_rows, shard.index)),
                    "row": int64s(rows),
                }
            )
    except (OSError, pa.ArrowException) as exc:
        raise read_error(shard, "cannot decode rows", exc) from exc
    finally:
        pf.close()
    check_unchanged(shard)
    diff.passing[shard.index] = passing
    diff.input_rows += passing


def committed_keys(store: Store, file: str, id_column: str, index: int) -> pa.Table:
    """A committed file's rows as (id, hash, file, row): its id and hash columns alone."""
    table = store.read_table(file, [id_column, ROW_HASH])
    rows = np.arange(table.num_rows, dtype=np.int64)
    return pa.table(
        {
            "id": normalized(table.select([id_column])).column(0),
            "h": table.column(ROW_HASH),
            "file": int64s(np.full(table.num_rows, index)),
            "row": int64s(rows),
        }
    )


def join(
    inputs: pa.Table,
    outputs: pa.Table,
    diff: RowDiff,
    shards: list[Shard],
    *,
    failed: set[int],
    partial: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """One part of each side, joined: the input rows to score and the committed rows to
    retire (packed), counted into ``diff``."""
    import polars as pl

    found, folder = inputs.schema.field("id").type, outputs.schema.field("id").type
    if found != folder:  # the folder's type holds the input's (`batchscore.output.drift`)
        try:
            inputs = inputs.set_column(0, "id", inputs.column("id").cast(folder))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputDataError(
                f"[input].id is {found} in the input but the committed output holds it as "
                f"{folder}: {exc}"
            ) from None
    left, right = pl.from_arrow(inputs), pl.from_arrow(outputs)
    if failed:
        left = left.filter(~pl.col("shard").is_in(list(failed)))
    check_unique(left, shards)
    # a committed (id, hash) held twice (never by this protocol, but a folder is evidence):
    # the first in file order stays, the others retire
    twice, first = right.head(0), right
    if right.select(pl.struct("id", "h").is_duplicated().any()).item():  # the rare case
        right = right.sort(["file", "row"]).with_columns(
            pl.int_range(pl.len()).over(["id", "h"]).alias("n")
        )
        twice = right.filter(pl.col("n") > 0).drop("n")
        first = right.filter(pl.col("n") == 0).drop("n")
    score = left.join(first, on=["id", "h"], how="anti")
    retire = first.join(left, on=["id", "h"], how="anti")
    changed = score.join(first, on="id", how="semi").height
    diff.changed += changed
    diff.new += score.height - changed
    diff.unchanged += left.height - score.height
    diff.deleted += retire.height - retire.join(left, on="id", how="semi").height
    diff.twice += twice.height
    diff.retired += retire.height + twice.height
    if partial:  # a partial view of the input: new rows only, nothing replaced or retired
        score = score.join(first, on="id", how="anti")
        return packed_of(score, "shard"), np.zeros(0, dtype=np.int64)
    to_score = packed_of(score, "shard")
    to_retire = np.concatenate([packed_of(retire, "file"), packed_of(twice, "file")])
    return to_score, to_retire


def packed_of(frame: Any, source: str) -> np.ndarray:
    sources = frame.get_column(source).to_numpy().astype(np.int64)
    return (sources << np.int64(SHIFT)) | frame.get_column("row").to_numpy().astype(np.int64)


def check_unique(left: Any, shards: list[Shard]) -> None:
    """`DuplicateIdError` naming the first few ids that more than one input row holds."""
    import polars as pl

    twice = left.filter(pl.col("id").is_duplicated())
    if not twice.height:
        return
    paths = {s.index: s.path for s in shards}
    ids = twice.sort(["shard", "row"]).group_by("id", maintain_order=True).agg("shard", "row")
    text = ids.schema["id"] == pl.String
    if text:  # named by their bytes: an id that is not UTF-8 is no Python string
        ids = ids.with_columns(pl.col("id").cast(pl.Binary))
    said = []
    for value, where, rows in ids.head(NAMED).iter_rows():
        places = " and ".join(f"{paths[s]} row {r}" for s, r in zip(where, rows, strict=True))
        shown = value.decode("utf-8", "backslashreplace") if text else value
        said.append(f"{shown!r} at {places}")
    more = ids.height - NAMED
    raise DuplicateIdError(
        f"[input].id: {ids.height} id(s) name more than one input row: {'; '.join(said)}"
        + (f"; and {more} more" if more > 0 else "")
        + '. With increments = "rows" an id names one row: make the ids unique, or filter '
        "the repeats out with [input].where"
    )
