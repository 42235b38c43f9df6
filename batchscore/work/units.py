"""The units of work every layer shares, from the shard a job names to the rows the writer takes.

    Shard -> Chunk (the unit of commit) -> Rows (a window of its rows, `where` applied)
          -> Part (one chunk's rows in a window) -> Window (encoded: `Encoded`, cut in batches)
          -> Scored (a chunk's output rows, or the error that failed its shard)

Plain data, no model and no I/O: the reader, the stages, the model's thread, the committer and
the engines pass these between them, so each of those can be read without the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import BatchscoreError, InputDataError
from batchscore.storage.layout import chunk_key, piece_key, shard_key
from batchscore.storage.retry import Retry


@dataclass(frozen=True)
class Shard:
    """One input Parquet file; `index` is its place in sorted path order (this run's only)."""

    index: int
    path: str
    size: int
    mtime_ns: int
    # how transient read errors are retried (and counted) for this run; not part of identity
    retry: Retry = field(default_factory=Retry, compare=False, repr=False)

    @property
    def key(self) -> str:
        """The shard's part of its output names (see `batchscore.storage.layout`)."""
        return shard_key(self.path)

    @property
    def identity(self) -> dict[str, int | str]:
        """What must stay equal for committed chunks of this shard to remain valid."""
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Chunk:
    """A fixed row range of one shard: the unit of commit.

    By rows (`[input].increments = "rows"`) a chunk holds the rows of its range still to score,
    ``picks`` (shard rows; None: every row of the range), and its name has the ``label`` of the
    increment that cut it: rows scored by a later increment land in files of their own.

    A chunk whose rows took longer than `[output].commit_s` to score is committed in pieces
    (`cut`): ``span`` is then the whole chunk's range, and ``start``-``stop`` the rows of this
    piece, or of the rest still to score.
    """

    shard: Shard
    index: int
    start: int
    stop: int
    of: int  # how many chunks the shard has
    picks: np.ndarray | None = field(default=None, compare=False, repr=False)
    label: str = ""
    span: tuple[int, int] | None = None  # the whole chunk's rows, when these are a part of it

    @property
    def key(self) -> str:
        """Deterministic name from shard and chunk numbers (and the increment's label, by
        rows), and a piece's first row; never from input strings."""
        if self.whole:
            return self.whole_key
        return piece_key(self.whole_key, self.start)

    @property
    def whole_key(self) -> str:
        """The whole chunk's key (a piece's file is named from it, `piece_key`)."""
        if self.label:
            return chunk_key(shard_key(f"{self.label}:{self.shard.path}"), self.index)
        return chunk_key(self.shard.key, self.index)

    @property
    def whole(self) -> bool:
        """Whether these are all of the chunk's rows (not a piece of it)."""
        return self.span is None or self.span == (self.start, self.stop)

    @property
    def names(self) -> tuple[str, ...]:
        """The keys its first file may take: its own, or its first piece's (cut by time)."""
        first = piece_key(self.whole_key, self.start)
        return (self.key,) if self.key == first else (self.key, first)

    def cut(self, at: int) -> tuple[Chunk, Chunk]:
        """The rows before shard row ``at`` (a piece, committed on its own) and the rest."""
        span = self.span or (self.start, self.stop)
        if self.picks is None:
            before = after = None
        else:
            before, after = self.picks[self.picks < at], self.picks[self.picks >= at]
        piece = replace(self, stop=at, picks=before, span=span)
        return piece, replace(self, start=at, picks=after, span=span)

    @property
    def picked(self) -> int:
        """The input rows of the range it scores."""
        return self.rows if self.picks is None else len(self.picks)

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunks_of(shard: Shard, num_rows: int, chunk_rows: int) -> list[Chunk]:
    """Cut a shard into fixed row ranges of `chunk_rows` (one chunk when the shard is small)."""
    starts = range(0, max(num_rows, 1), chunk_rows)
    return [
        Chunk(shard, i, s, min(s + chunk_rows, num_rows), len(starts)) for i, s in enumerate(starts)
    ]


@dataclass
class Rows:
    """One window of a chunk's rows, those that passed `[input].where`."""

    table: pa.Table
    offset: int  # shard row of the window's first input row
    read: int  # input rows the window covers, before `where`
    kept: np.ndarray | None = None  # with `where`: the shard row of each table row
    picked: bool = False  # by rows: the chunk picked these rows (`Chunk.picks`)

    @property
    def dropped(self) -> int:
        """Input rows `where` dropped from the window: none where the chunk picked its rows
        (the diff applied `where`; the rows of the range it did not pick are committed
        already or another increment's, not filtered)."""
        return 0 if self.picked else self.read - self.table.num_rows

    def shard_row(self, r: int) -> int:
        """The shard row of the window's row ``r``, for messages."""
        return self.offset + r if self.kept is None else int(self.kept[r])

    def split(self, n: int) -> tuple[Rows, Rows]:
        """The window's first ``n`` input rows and the rest, each a window of its own."""
        if self.kept is None:
            cut, kept = n, (None, None)
        else:
            cut = int(np.searchsorted(self.kept, self.offset + n))
            kept = (self.kept[:cut], self.kept[cut:])
        head = Rows(self.table.slice(0, cut), self.offset, n, kept[0], self.picked)
        rest = Rows(self.table.slice(cut), self.offset + n, self.read - n, kept[1], self.picked)
        return head, rest

    def join(self, more: Rows) -> Rows:
        """These rows and the chunk's next ``more`` (read just after them), as one window."""
        table = pa.concat_tables([self.table, more.table])
        kept = None if self.kept is None else np.concatenate([self.kept, more.kept])
        return Rows(table, self.offset, self.read + more.read, kept, self.picked)


@dataclass
class Encoded:
    """One window, ready for the model.

    Units are what the model scores: a row, or one sentence of a row. ``lengths[u]`` is unit
    ``u``'s token count and ``owners[u]`` the index into ``rows`` of the row it belongs to.
    ``rows`` are the window rows that encoded; every other row is in ``errors`` (window row ->
    message) and gets no output. ``reserve`` is how many tokens each unit grows by while it is
    scored (generated tokens), which the batch budget must also hold. ``type_ids`` are a text
    pair's segments, per unit. ``chunked`` counts the texts cut into windows (several units for
    one text, with `[model].long_text = "chunk"`) and ``windows`` those texts' units.
    """

    lengths: np.ndarray
    owners: np.ndarray
    rows: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)
    ids: list[np.ndarray] | None = None
    truncated: int = 0
    reserve: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    type_ids: list[np.ndarray] | None = None
    chunked: int = 0
    windows: int = 0


@dataclass
class Part:
    """One chunk's rows in a window: the window's table rows ``start`` to ``start + rows``."""

    chunk: Chunk
    rows: Rows
    start: int = 0

    @property
    def stop(self) -> int:
        return self.start + self.rows.table.num_rows


@dataclass
class Window:
    """Rows of one or more chunks between reader and model, in chunk order; `error` marks the
    chunk of a shard that failed (its only part, with no rows)."""

    parts: list[Part]
    table: pa.Table | None = None
    encoded: Encoded | None = None
    units: np.ndarray | None = None  # the units to score: each distinct input once
    same_as: np.ndarray | None = None  # unit -> the identical unit scored for it, if any repeat
    known: np.ndarray | None = None  # units whose result the model gave before (`Known`) ...
    known_results: np.ndarray | None = None  # ... and those results; the batches leave them out
    batches: list[np.ndarray] = field(default_factory=list)
    cut_for: int = 0  # the max_tokens the batches were cut for
    error: BatchscoreError | None = None

    @property
    def chunk(self) -> Chunk:
        """The first part's chunk (the failed one, for an error window)."""
        return self.parts[0].chunk

    @property
    def pending(self) -> np.ndarray:
        """The units the model has still to score: every distinct unit but the known ones."""
        if self.known is None or not len(self.known):
            return self.units
        return np.setdiff1d(self.units, self.known, assume_unique=True)

    def part_of(self, row: int) -> Part:
        """The part a window row belongs to."""
        return next(p for p in self.parts if p.start <= row < p.stop)

    def where(self, row: int) -> str:
        """A window row, as messages name it: its shard and the row in that shard."""
        part = self.part_of(row)
        return f"{part.chunk.shard.path}: row {part.rows.shard_row(row - part.start)}"


def failed(chunk: Chunk, error: BatchscoreError) -> Window:
    """The window that carries a shard's failure to the committer, in the chunk's place."""
    empty = Rows(pa.table({}), chunk.start, 0)
    return Window([Part(chunk, empty)], error=error)


@dataclass
class Scored:
    """A window on its way to the writer: output rows, or the error that failed its shard."""

    chunk: Chunk
    table: pa.Table | None = None
    rejected: pa.Table | None = None  # its rows recorded with an error (`row_errors.rejected`)
    error: InputDataError | None = None
    read: int | None = None  # input rows the window covers before `where`; None: table's rows
    # when the model began its window (`time.monotonic`, in the scorer's process): the start
    # of the committer's clock (`[output].commit_s`); None: not known, the handoff's moment
    started: float | None = None
