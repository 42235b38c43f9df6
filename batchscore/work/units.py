"""The units of work every layer shares, from the shard a job names to the rows the writer takes.

    Shard -> Chunk (the unit of commit) -> Rows (a window of its rows, `where` applied)
          -> Part (one chunk's rows in a window) -> Window (encoded: `Encoded`, cut in batches)
          -> Scored (a chunk's output rows, or the error that failed its shard)

Plain data, no model and no I/O: the reader, the stages, the model's thread, the committer and
the engines pass these between them, so each of those can be read without the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchscore.storage.layout import chunk_key, shard_key
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
    """A fixed row range of one shard: the unit of commit."""

    shard: Shard
    index: int
    start: int
    stop: int
    of: int  # how many chunks the shard has

    @property
    def key(self) -> str:
        """Deterministic name from shard and chunk numbers; never from input strings."""
        return chunk_key(self.shard.key, self.index)

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunks_of(shard: Shard, num_rows: int, chunk_rows: int) -> list[Chunk]:
    """Cut a shard into fixed row ranges of `chunk_rows` (one chunk when the shard is small)."""
    starts = range(0, max(num_rows, 1), chunk_rows)
    return [
        Chunk(shard, i, s, min(s + chunk_rows, num_rows), len(starts)) for i, s in enumerate(starts)
    ]
