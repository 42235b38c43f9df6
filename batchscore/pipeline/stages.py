"""The stages between reader and model: rows -> encoded window -> batches.

    read_rows (reader, `where`) -> task.encode (tokenizer) -> distinct units -> batches (sampler)

`windows` runs them for every pending chunk (in the reader thread). A window gathers rows from
consecutive chunks, of any number of shards, until it holds `[batching].window_rows`, so many
small shards sort and batch as well as one large one; each chunk keeps its own rows (a `Part`)
and is still committed on its own. `sample_rows` reads the job's first distinct rows through
the same reader and filter, for the quality gate and int8 calibration. Batches are cut by the
job's batching policy (`batchscore.pipeline.batching`), the one way rows become batches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from batchscore.errors import InputDataError, JobError
from batchscore.job.sections import ROW_HASH, BatchingConfig, InputConfig
from batchscore.job.where import RowFilter
from batchscore.models.base import Encoding, Task
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.known import Known, unit_keys
from batchscore.pipeline.pace import Pace
from batchscore.pipeline.reader import read_rows
from batchscore.pipeline.sampler import first_of_each
from batchscore.work.columns import gather
from batchscore.work.folders import FOLDER, image_layout, with_folder
from batchscore.work.row_hash import hash_column, hashed_columns
from batchscore.work.shards import check_columns, open_shard
from batchscore.work.text_bytes import undecoded
from batchscore.work.units import Chunk, Encoded, Part, Rows, Shard, Window, chunks_of, failed

log = logging.getLogger("batchscore")


def input_columns(inp: InputConfig, kinds: dict[str, str]) -> tuple[str, ...]:
    """The input columns a run reads: those copied to the output, the task's (``kinds``), and
    those `where` tests."""
    row_filter = inp.row_filter
    needs = row_filter.columns if row_filter else ()
    return tuple(dict.fromkeys([*inp.copied, *kinds, *needs]))


def with_row_hash(rows: Rows, hashed: tuple[str, ...]) -> Rows:
    """By rows, a window's rows with each one's hash, the column the output carries it in."""
    rows.table = rows.table.append_column(ROW_HASH, hash_column(rows.table, hashed))
    return rows


def check_fits(encoded: Encoded, max_tokens: int) -> None:
    """A row longer than the job's budget is the job's mistake (exit 2), not a row error."""
    sizes = encoded.lengths + encoded.reserve
    if sizes.size and sizes.max() > max_tokens:
        raise JobError(
            f"[batching].max_tokens = {max_tokens} cannot hold a row of {sizes.max()} tokens; "
            "raise it, or lower [model].max_length"
        )


def distinct(encoded: Encoded, keys: list[bytes] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The units worth scoring: identical inputs (``keys``, `unit_keys`) are scored once, since
    every task's result depends on its input alone (seeded sampling seeds each row from its
    prompt). Returns them, and unit -> its scored twin when any repeat."""
    units = np.arange(len(encoded.lengths))
    if keys is None:
        return units, None
    first, same_as = first_of_each(keys)
    return (first, same_as) if len(first) < len(units) else (units, None)


def windows(
    chunks: list[Chunk],
    task: Encoding,
    *,
    inp: InputConfig,
    kinds: dict[str, str],
    batching: BatchingConfig,
    on_error: str,
    known: Known | None = None,
    pace: Pace | None = None,
) -> Iterator[Window]:
    """Reader + tokenizer + sampler for every pending chunk (runs in the reader thread): the
    `[input]` columns (the task's, ``kinds``, among them) that pass `where`, in windows cut by
    `[batching]`; ``on_error`` is `[output].on_error`.

    Rows gather across chunks until a window holds `[batching].window_rows` input rows, or
    what the model scores in a share of `[output].commit_s` (``pace``), if fewer. A shard
    that fails reading yields one window carrying its error, after the rows read before it, and
    no more of its rows.
    """
    row_filter = inp.row_filter
    columns, size = input_columns(inp, kinds), window_rows(task, batching)
    hashed = hashed_columns(inp, kinds) if inp.by_rows else None
    policy = Batching.of(batching, task)
    gone: set[int] = set()  # shards that failed

    def window(parts: list[Part]) -> Iterator[Window]:
        return combine(parts, task, gone, policy, on_error, known)

    def most() -> int:  # input rows the next window may hold
        return size if pace is None else min(size, pace.rows())

    parts: list[Part] = []
    read, limit = 0, most()  # input rows the parts cover, and may
    for chunk in chunks:
        if chunk.shard.index in gone:
            continue
        try:
            for rows in read_rows(chunk, columns, size, row_filter):
                rows.table = with_folder(rows.table, chunk.shard.path, kinds)
                if hashed is not None:
                    rows = with_row_hash(rows, hashed)
                if parts and rows.table.schema != parts[-1].rows.table.schema:
                    yield from window(parts)  # one window, one schema
                    parts, read, limit = [], 0, most()
                while rows.read > limit - read:  # the window's last rows; the rest go on
                    head, rows = rows.split(limit - read)
                    yield from window(joined(parts, chunk, head))
                    parts, read, limit = [], 0, most()
                parts = joined(parts, chunk, rows)
                read += rows.read
                if read >= limit:
                    yield from window(parts)
                    parts, read, limit = [], 0, most()
        except InputDataError as exc:
            yield from window(parts)  # what was read before, first
            parts, read, limit = [], 0, most()
            gone.add(chunk.shard.index)
            yield failed(chunk, exc)
    yield from window(parts)


def joined(parts: list[Part], chunk: Chunk, rows: Rows) -> list[Part]:
    """``parts`` and ``chunk``'s next ``rows``: a chunk has one part in a window, its rows in
    order (a window cut short, `[output].commit_s`, leaves the rest of a read to the next)."""
    if parts and parts[-1].chunk is chunk:
        return [*parts[:-1], Part(chunk, parts[-1].rows.join(rows))]
    return [*parts, Part(chunk, rows)]


def window_rows(task: Encoding, batching: BatchingConfig) -> int:
    """`[batching].window_rows`, or fewer where the encoding holds more than token ids per
    row: decoded images say how many of them fit their memory budget (``max_window_rows``)."""
    cap = getattr(task, "max_window_rows", None)
    return min(batching.window_rows, cap) if cap else batching.window_rows


def combine(
    parts: list[Part],
    task: Encoding,
    gone: set[int],
    policy: Batching,
    on_error: str,
    known: Known | None = None,
) -> Iterator[Window]:
    """One window of ``parts`` (of shards not in ``gone``), encoded and cut. Under
    ``on_error = "fail"`` a row that cannot be encoded fails its shard alone: every shard with
    such a row leaves the window at once (its failure goes in its place, naming its first
    such row), and the rest is encoded once more: a window is tokenized at most twice, however
    many of its shards fail."""
    while parts := [p for p in parts if p.chunk.shard.index not in gone]:
        table = pa.concat_tables([p.rows.table for p in parts]) if len(parts) > 1 else None
        start = 0
        for part in parts:
            part.start, start = start, start + part.rows.table.num_rows
        window = Window(parts, table if table is not None else parts[0].rows.table)
        try:
            yield encode(window, task, policy, on_error, known)
            return
        except RowError as exc:
            for chunk, error in exc.failures:
                gone.add(chunk.shard.index)
                yield failed(chunk, error)
        except InputDataError as exc:  # about the columns, not a row: every shard here fails
            for chunk in dict.fromkeys(p.chunk for p in parts):
                if chunk.shard.index not in gone:
                    gone.add(chunk.shard.index)
                    yield failed(chunk, InputDataError(f"{chunk.shard.path}: {exc}"))


class RowError(InputDataError):
    """Rows that cannot be encoded under ``on_error = "fail"``: each fails its shard.
    ``failures`` holds each such shard's first such row, with its chunk and error, in window
    order; the message is the first of them."""

    def __init__(self, failures: list[tuple[Chunk, InputDataError]]) -> None:
        super().__init__(str(failures[0][1]))
        self.failures = failures


def row_error(window: Window, errors: dict[int, str]) -> RowError:
    """The `RowError` of a window's rows that cannot be encoded (window row -> message)."""
    first: dict[int, tuple[Chunk, InputDataError]] = {}  # shard index -> its first row's
    for row in sorted(errors):
        chunk = window.part_of(row).chunk
        if chunk.shard.index not in first:
            error = InputDataError(f"{window.where(row)}, {errors[row]}")
            first[chunk.shard.index] = (chunk, error)
    return RowError(list(first.values()))


def encode(
    window: Window,
    task: Encoding,
    policy: Batching,
    on_error: str,
    known: Known | None = None,
) -> Window:
    """Tokenizer + sampler for a window: encoded, repeats found, batches cut by ``policy``
    (the job's, `Batching.of`); `RowError` for the first row that cannot be encoded under
    ``on_error = "fail"``. ``task`` is the adapter, or (`batchscore plan`) its encoding alone,
    without weights. Units whose result is ``known`` (taken from it) are set aside with their
    results and not batched."""
    max_tokens = policy.max_tokens
    encoded = task.encode(window.table)
    if encoded.errors and on_error == "fail":
        raise row_error(window, encoded.errors)
    check_fits(encoded, max_tokens)
    keys = unit_keys(encoded)
    units, same_as = distinct(encoded, keys)
    window.encoded, window.units, window.same_as = encoded, units, same_as
    if known and keys is not None:
        window.known, window.known_results = known.take(keys, units)
    window.batches, window.cut_for = policy.batches(encoded, window.pending), max_tokens
    return window


def encode_window(
    chunk: Chunk,
    rows: Rows,
    task: Task,
    policy: Batching,
    on_error: str,
    known: Known | None = None,
) -> Window:
    """One chunk's window of rows, encoded and cut (`InputDataError` under ``on_error =
    "fail"`` for a row that cannot be encoded): for callers that read rows themselves."""
    return encode(Window([Part(chunk, rows)], rows.table), task, policy, on_error, known)


def sample_rows(
    inp: InputConfig, kinds: dict[str, str], shards: list[Shard], rows: int
) -> pa.Table:
    """The first ``rows`` distinct inputs of ``shards`` (in order) that pass `where`, read by
    the run's own reader: the rows the quality gate, int8 calibration, the budget and int8 /
    uint8 embeddings' ranges are measured on, so only the task's columns (``kinds``).

    A row whose inputs repeat an earlier sample row's is passed over and the sample read on
    past it, as far into the input as it takes: a repeat is scored once (`distinct`) and
    measures nothing new, so a block of one text at the start (an "N/A" run, a boilerplate
    header) would leave a sample of one input, and ranges of no width.

    A shard that cannot be read, whose columns do not fit the job, or whose rows cannot join
    the others' is passed over: the run fails it alone, and measures on the rest.
    """
    row_filter = inp.row_filter
    columns = tuple(dict.fromkeys([*kinds, *(row_filter.columns if row_filter else ())]))
    sample: pa.Table | None = None
    seen: set[str] = set()
    for shard in shards:
        have = 0 if sample is None else sample.num_rows
        if have >= rows:
            break
        more = set(seen)  # kept only if this shard's rows join the sample
        try:
            taken = first_rows(shard, kinds, columns, row_filter, rows=rows - have, seen=more)
        except InputDataError as exc:
            log.debug("the measured sample passes over %s", exc)
            continue
        joined = gather([taken] if sample is None else [sample, taken])
        if joined is None or joined.num_rows < have + taken.num_rows:
            log.debug("the measured sample passes over %s: its columns differ", shard.path)
            continue
        sample, seen = joined, more
    if sample is not None:
        return sample
    return pa.table(
        {c: pa.array([], pa.string() if k == "text" else pa.null()) for c, k in kinds.items()}
    )


def first_rows(
    shard: Shard,
    kinds: dict[str, str],
    columns: tuple[str, ...],
    row_filter: RowFilter | None,
    *,
    rows: int,
    seen: set[str],
) -> pa.Table:
    """A shard's first ``rows`` rows that pass `where` and are no repeat of one ``seen`` (which
    learns them, `first_distinct`), its task columns alone."""
    footer = open_shard(shard)
    check_columns(shard, footer.schema_arrow, columns, kinds)
    taken, count = [], 0
    for chunk in chunks_of(shard, footer.metadata.num_rows, max(rows, 1)):
        for window in read_rows(chunk, columns, rows, row_filter):
            table = with_folder(window.table, shard.path, kinds)
            for name in (c for c, kind in kinds.items() if kind == "image"):  # one layout
                table = table.set_column(
                    table.schema.get_field_index(name), name, image_layout(table.column(name))
                )
            wanted = [c for c in (*kinds, FOLDER) if c in table.column_names]
            taken.append(first_distinct(table.select(wanted), rows - count, seen))
            count += taken[-1].num_rows
            if count >= rows:
                return pa.concat_tables(taken)
    return pa.concat_tables(taken)


def first_distinct(table: pa.Table, rows: int, seen: set[str]) -> pa.Table:
    """``table``'s first ``rows`` rows whose values (every column's) are in no earlier row and
    not in ``seen``, which learns those it returns: the measured sample of in-memory data
    (`score`) and of each shard's rows. Read a slice at a time, so a frame of millions of rows
    is not turned into Python objects to find the first few hundred. Texts are compared as
    their bytes (`undecoded`): a row that is not UTF-8 is the task's to refuse, as a row error,
    when the sample is encoded."""
    kept: list[int] = []
    step = max(rows, 1024)
    for start in range(0, table.num_rows, step):
        values = [undecoded(column).to_pylist() for column in table.slice(start, step).columns]
        for offset, row in enumerate(zip(*values, strict=True)):
            if len(kept) >= rows:
                break
            key = repr(row)
            if key not in seen:
                seen.add(key)
                kept.append(start + offset)
        if len(kept) >= rows:
            break
    return table if len(kept) == table.num_rows else table.take(pa.array(kept, pa.int64()))
