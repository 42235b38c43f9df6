"""What a plan of work is made from (`Survey`), and the plan itself (`Plan`): a value.

Planning (`batchscore.output.todo.to_do`) reads the input's footers, the commit records, the
data files' footers and a table's log, and writes nothing: `batchscore plan`, `status` and
`validate` stop there. A run then carries the plan out (`batchscore.output.apply`): the files
that retire, the chunks that are un-committed, the rows that retire, the room made for new
files, the table made one with the records. So what a run would do can be shown, and tested,
apart from doing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.job.sections import InputConfig
from batchscore.output.diff import RowDiff
from batchscore.work.units import Chunk, Shard


@dataclass(frozen=True, kw_only=True)
class Survey:
    """What a plan is made from, besides the output folder: the job's input section, the
    columns its task reads (by kind), the chunk size, the input as listed (once: what else
    the run reads of it comes from this listing), the fingerprint of what decides the output
    (empty for a look that makes no room for new files: `status`, `validate`) and, by rows,
    the run's label, in its chunks' names."""

    inp: InputConfig
    kinds: dict[str, str]
    chunk_rows: int
    shards: tuple[Shard, ...]
    fingerprint: str = ""
    label: str = ""


@dataclass(frozen=True)
class Room:
    """A file at a pending chunk's name: ``ours`` (its footer says this job wrote it for that
    chunk, and its commit record was lost: a crashed attempt's, cleared) or not (a file
    batchscore did not write: it blocks the run, left as it is)."""

    name: str
    ours: bool


@dataclass(frozen=True)
class TableWork:
    """What making a table's log one with the commit records does (see
    `batchscore.output.neighbours`): keys made for committed chunks that lack them, chunk
    files the table holds that no record that holds names (they leave it), and committed
    files it lacks that batchscore's append never reached its log with (they join it)."""

    backfill: frozenset[str]
    stray: frozenset[str]
    missing: frozenset[str]


@dataclass(frozen=True)
class Plan:
    """The work a run has to do, and what it must change first; nothing rebinds or changes
    it once made (a run counts into its own copy, `batchscore.output.pending.Pending`).

    What `Pending` holds (the chunks to score and the counts), as a dry run sees them, then
    the actions: ``leaving``, the committed chunks of shards that left the input (their files
    move to ``_batchscore/gone/``, with those of damaged records of such shards);
    ``uncommit``, the chunks un-committed (why: ``redone``); ``taken``, those another writer
    took over (of them, ``take_out`` leave the table by their keys); by rows ``retire``, the
    rows of committed files that retire (``diff`` says why); ``room``, the files at pending
    chunks' names, in the order they are met; ``table``, the table's reconciliation.
    ``records`` are the commit records read, ``damaged`` the bookkeeping files that could not
    be (a run removes them, but for those a retirement keeps)."""

    survey: Survey
    chunks: list[Chunk]
    carried: pa.Schema | None  # output types of the carried columns
    failures: list[dict[str, str]]
    redone: list[dict[str, str]]  # committed, now to score again
    gone: list[dict[str, Any]]  # shards no longer input: their output, as it stands
    done_chunks: int
    done_rows: int
    total_rows: int  # the job's input rows, from the footers (the bad-row gate's base)
    bad_by_shard: dict[str, int]  # committed rows with an error
    increments: dict[str, int] | None  # by rows: the diff's counts (`output.diff`)
    passing: dict[int, int]  # by rows: shard index -> its rows that pass `where`
    records: Mapping[str, dict[str, Any]]
    damaged: Mapping[str, str]
    leaving: frozenset[str] = frozenset()
    uncommit: tuple[str, ...] = ()
    taken: frozenset[str] = frozenset()
    take_out: frozenset[str] = frozenset()
    retire: Mapping[str, np.ndarray] | None = None
    diff: RowDiff | None = None
    room: tuple[Room, ...] = ()
    table: TableWork = TableWork(frozenset(), frozenset(), frozenset())

    @property
    def shards(self) -> list[Shard]:
        """The input as listed for this plan."""
        return list(self.survey.shards)

    @property
    def blocking(self) -> list[str]:
        """The files batchscore did not write where this job's output goes."""
        return [room.name for room in self.room if not room.ours]
