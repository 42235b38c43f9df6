"""What an output format is: the hooks the commit protocol calls, whatever the output is.

The commit protocol is the folder's own, for every format (`batchscore.output.committer`,
`batchscore.output.checkpoint`): a chunk's data file is staged, checked and published under its
chunk's name, and its commit record is the commit point. A format is what readers see of
those files beyond the folder: a plain folder of Parquet files (nothing more), or a table
whose own log (Delta's, Iceberg's) must name a file before its readers see it. The format
table (`batchscore.output.format_table`) picks one entry per job, as `[output].format` says;
the protocol's callers never ask which they hold.

The hooks, by the moment the protocol calls them:

- **Types**: `fit` is the schema as the format stores it (Delta and Iceberg have no
  fixed-size lists and no unsigned integers); `check_takes` refuses, naming the column, a
  format whose columns no longer take batchscore's files (another writer dropped or retyped
  one).
- **A commit group**: `append` makes the group's published files the format's, in one
  transaction of its log, idempotent per chunk: a chunk already in it is not added again
  (a run killed between the log's commit and its commit records appends nothing twice).
- **A file leaving**: `retire_files` takes the chunks whose data files (or keys) are about
  to be deleted or moved out of the format's log first, so nothing the log names is deleted
  under its readers; `rewrite` swaps a chunk's file for its successor's (by rows, a file
  some of whose rows retire: a folder rewrites it in place, `rewrites_in_place`; a table
  under a new chunk key).
- **Other writers** (`batchscore.output.neighbours`): a table is shared; `chunks` and `handed`
  tell the chunks whose files it holds and those another writer took over (compacted, say),
  `take_back` and `delete_rows` take such chunks' rows out by their keys, `kept` and
  `drop_keys` are those keys, `whose` names the commits that took files over, `scan` reads
  a column of every row the format holds, and `create` and `mend` make the log name exactly
  the committed chunks' files again after a kill at an unforeseen moment.

A folder of Parquet files answers each hook with "nothing to do" (`ParquetFolder`, here: the
protocol's plainest entry, and the format of a `Checkpoint` until a recipe sets the job's).
docs/architecture.md#output-formats shows how to add one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import pyarrow as pa

from batchscore.output.manifest import FileFacts
from batchscore.storage.store import Store

# what a table's refusal of batchscore's columns advises (`check_takes`), every format alike
WHAT_TO_DO = (
    "batchscore changed nothing; give the table back the column as batchscore writes it, or "
    "run with --restart (batchscore's rows leave the table and are written again), or point "
    "[output].path elsewhere"
)


def after(version: int, *, odd: bool) -> int:
    """The next version of a chunk in a table's log above ``version`` that is odd (the
    chunk's file in the table) or even (out of it): Delta's application transactions and
    Iceberg's table properties count a chunk's comings and goings so."""
    return version + 1 if version % 2 != odd else version + 2


class OutputFormat(Protocol):
    """One entry of the format table, opened for one output folder (see the module's note)."""

    name: str  # `[output].format`: "parquet", "delta", "iceberg"
    title: str  # what messages call it: "the Parquet folder", "the Delta table"
    uri: str  # where its readers open it: the folder's path or URL
    store: Store  # the output folder's (keys and logs are read through it)
    # the job's `[input].id` where the format keeps each chunk's keys (tables: rows another
    # writer took over are found by them); None where it keeps none
    id_column: str | None
    rewrites_in_place: bool  # a file some of whose rows retire is rewritten at its own name

    def fit(self, schema: pa.Schema) -> pa.Schema:
        """The output schema as the format stores it (metadata kept)."""
        ...

    def check_takes(self, ours: pa.Schema | None, *, what: str = "") -> None:
        """Refuse (`WriteError`, naming the column) columns ``ours`` the format no longer takes."""
        ...

    def exists(self) -> bool:
        """Whether the format's log exists yet (a folder's always does)."""
        ...

    def holds_files(self) -> bool:
        """Whether the format's log names any data file at all (anyone's)."""
        ...

    def append(
        self, files: list[tuple[str, FileFacts]], *, schema: pa.Schema, metadata: dict[str, str]
    ) -> None:
        """Make published files of chunks (key, facts) the format's, in one transaction."""
        ...

    def retire_files(self, rels: Iterable[str]) -> None:
        """Take the chunks whose data files or keys ``rels`` name out of the format's log."""
        ...

    def retire(self, keys: Iterable[str]) -> int:
        """Take chunks ``keys`` out of the format's log; returns how many were in it."""
        ...

    def rewrite(self, old: str, new: str, *, size: int, rows: int) -> None:
        """Swap chunk ``old``'s file for chunk ``new``'s in one transaction."""
        ...

    def chunks(self) -> set[str]:
        """The chunks whose own files the format's log names."""
        ...

    def handed(self, keys: Iterable[str]) -> set[str]:
        """Those of chunks ``keys`` another writer took over (in the log, their file not)."""
        ...

    def take_back(self, keys: list[str]) -> None:
        """Take the rows of chunks another writer took over out, by their keys."""
        ...

    def delete_rows(self, leaving: dict[str, pa.Table]) -> None:
        """Take some rows of chunks another writer took over out, by their keys."""
        ...

    def kept(self) -> set[str]:
        """The chunks whose keys are kept."""
        ...

    def drop_keys(self, keys: Iterable[str]) -> None:
        """Delete chunks' keys (a missing one is fine)."""
        ...

    def create(self, schema: pa.Schema) -> None:
        """Make the format's log, naming no file, with these columns."""
        ...

    def out_of_step(self, committed: set[str]) -> tuple[set[str], set[str]]:
        """What `mend` would do for ``committed`` chunks: the chunk files the log names that
        no record does (stray), and the committed ones batchscore never added (missing)."""
        ...

    def mend(
        self, committed: dict[str, dict[str, Any]], *, stray: list[str], missing: set[str]
    ) -> None:
        """One transaction: ``stray`` chunks' files out, the ``missing`` committed ones that
        batchscore never added (not another writer's taking) in."""
        ...

    def whose(self, names: set[str]) -> str:
        """Which commits took data files ``names`` out, in words."""
        ...

    def scan(self, column: str) -> Iterator[pa.Array]:
        """Every value of ``column`` the format's readers see (nothing where it has none)."""
        ...


class ParquetFolder:
    """The plain format (``[output].format = "parquet"``), and every folder's until the job
    names another: readers glob the folder (`**/*.parquet`), so a published file is read as
    soon as it is in place and a file deleted or moved is gone. There is no log to keep in
    step and no other writer whose commits to respect (batchscore records every file it
    writes and never touches another's), so every hook has nothing to do."""

    name = "parquet"
    title = "the Parquet folder"
    id_column = None  # rows are found by their files: no keys kept
    rewrites_in_place = True

    def __init__(self, store: Store) -> None:
        self.store, self.uri = store, str(store.url)

    def fit(self, schema: pa.Schema) -> pa.Schema:
        return schema

    def check_takes(self, ours: pa.Schema | None, *, what: str = "") -> None:
        return None  # the folder's own drift check holds its columns (`output.drift`)

    def exists(self) -> bool:
        return True

    def holds_files(self) -> bool:
        return False  # no log names them

    def append(
        self, files: list[tuple[str, FileFacts]], *, schema: pa.Schema, metadata: dict[str, str]
    ) -> None:
        return None  # published is read

    def retire_files(self, rels: Iterable[str]) -> None:
        return None

    def retire(self, keys: Iterable[str]) -> int:
        return 0

    def rewrite(self, old: str, new: str, *, size: int, rows: int) -> None:
        return None

    def chunks(self) -> set[str]:
        return set()

    def handed(self, keys: Iterable[str]) -> set[str]:
        return set()  # nobody takes a chunk over

    def take_back(self, keys: list[str]) -> None:
        return None

    def delete_rows(self, leaving: dict[str, pa.Table]) -> None:
        return None

    def kept(self) -> set[str]:
        return set()

    def drop_keys(self, keys: Iterable[str]) -> None:
        return None

    def create(self, schema: pa.Schema) -> None:
        return None

    def out_of_step(self, committed: set[str]) -> tuple[set[str], set[str]]:
        return set(), set()

    def mend(
        self, committed: dict[str, dict[str, Any]], *, stray: list[str], missing: set[str]
    ) -> None:
        return None

    def whose(self, names: set[str]) -> str:
        return ""

    def scan(self, column: str) -> Iterator[pa.Array]:
        return iter(())
