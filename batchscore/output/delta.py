"""An output folder that is a Delta Lake table (``[output].format = "delta"``), over `deltalake`.

The commit protocol stays the folder's own (`batchscore.output.committer`): a chunk's data file
is staged, checked and published under its chunk's name, and its commit record is the commit
point. In between, one Delta transaction adds the group's files to the table's log: from then
on Delta readers (deltalake, polars' ``read_delta``, DuckDB's ``delta_scan``, Spark) see its
rows, and before it they see none (a file the log does not name is no reader's).

Each transaction is idempotent through Delta's application transactions (``txn``: an app id
and a version, stored in the log with the files it commits): every chunk has its own app id
(`app_id`), whose version is odd while the chunk's file is in the table and even (or absent)
while it is not. Adding a chunk whose version is odd, or removing one whose version is even,
does nothing, so a run killed between a Delta commit and its commit record never appends the
chunk twice: the next start removes the unrecorded file from the table (one transaction that
makes its version even) before it deletes or replaces the file, and scores the chunk again.
Every step that deletes or moves a data file goes through `Checkpoint.remove` or
`Checkpoint.move`, which call `Table.retire` first: nothing the log names is ever deleted
under it.

The table is shared: other writers compact it, Z-order it, delete from it, vacuum it and add
columns to it, and their commits are its truth. A chunk whose version is odd but whose file
the table no longer holds was taken over by another writer (`Table.handed`): its rows are in
the table as that writer left them (some deleted, perhaps), in files of its own, and its own
file may be vacuumed away. That is neither damage nor drift: batchscore never adds the file
back, and never scores the chunk again while its input holds. When its rows must leave
(its shard left or changed, a row of it was edited or deleted, a ``--restart``), they are
found by the chunk's keys (`batchscore.output.keys`) and taken out by a Delta merge on the id
(and the row hash), wherever they now lie; another writer's own rows carry no row hash of
batchscore's, and are never touched by rows.

Retired output (a shard that left the input, a chunk un-committed, a ``--restart``) becomes a
Delta delete: `Table.retire` removes whole chunks (one transaction for a whole retirement). By
rows, a file some of whose rows retire is never rewritten in place (the log names each file
once, with its size and rows): its kept rows go to a new file under a new chunk key, and
`Table.rewrite` swaps the two in one transaction (`batchscore.output.rewrite`), so the table's
files and the committed chunks' files stay one set (but for those another writer took
over); `batchscore.output.neighbours.reconcile` mends them at a run's start if anything of
batchscore's left them apart. Each commit's info carries the lineage: the job, the model, the
precision and the batchscore version (``custom_metadata``, as ``DeltaTable.history()`` shows
it), and which chunks it added or removed.

Delta has no fixed-size lists and no unsigned integers, so a table's schema lists vectors as
lists and widens unsigned integers to the next signed type (`fit`); the Parquet footers still
carry batchscore's metadata. Columns another writer adds are kept, and batchscore commits
under them (`batchscore.output.delta_columns`). An object-store table uses the store's
standard credentials and endpoint (for S3 the ``AWS_*`` variables, as the Parquet output
does), read by `deltalake` itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from batchscore.errors import JobError, WriteError
from batchscore.job.sections import Job
from batchscore.output.contents import LINEAGE, lineage
from batchscore.output.delta_columns import check, delta_fields, difference, fields_of, fit, refusal
from batchscore.output.delta_log import by_whom
from batchscore.output.format import after
from batchscore.output.keys import chunks_named, drop_chunk_keys, kept_chunks, read_keys
from batchscore.output.manifest import FileFacts
from batchscore.storage.layout import is_chunk_name, part_key, part_name
from batchscore.storage.store import Store

log = logging.getLogger("batchscore")
EXTRA = "pip install 'batchscore[delta]'"


def app_id(key: str) -> str:
    """A chunk's application-transaction id in the table's log."""
    return f"batchscore-{key}"


def storage_options(url: str) -> dict[str, str]:
    """What `deltalake` needs beyond the store's standard chain: plain-HTTP endpoints (an
    ``AWS_ENDPOINT_URL`` on loopback) are allowed, as pyarrow's filesystems allow them."""
    return {"allow_http": "true"} if urlsplit(url).scheme in ("s3", "s3a") else {}


def delta_table(job: Job, store: Store) -> Table:
    """The job's output as a Delta table (the format table's "delta" entry)."""
    return Table(store, lineage=lineage(job), id_column=job.input.id)


class Table:
    """The Delta table at an output folder (created by the first commit that adds files).

    ``lineage`` goes into every commit's info; an append adds its data files' metadata.
    ``id_column``: the job's `[input].id`, whose values (with the row hash, by rows) find a
    chunk's rows once another writer took them over (None: they cannot be found).
    The format table's "delta" entry (`batchscore.output.format.OutputFormat`).
    """

    name = "delta"
    title = "the Delta table"
    rewrites_in_place = False  # the log names each file once, with its size and rows

    def __init__(
        self, store: Store, *, lineage: dict[str, str], id_column: str | None = None
    ) -> None:
        try:
            import deltalake  # noqa: F401  (optional: the `delta` extra)
        except ImportError:
            raise JobError(
                f'[output].format = "delta" needs the deltalake package: {EXTRA}'
            ) from None
        self.store, self.lineage, self.id_column = store, lineage, id_column
        self.uri = str(store.url)  # a local folder's path, or the store's URL
        self.options = storage_options(self.uri)
        self.dt: Any = None  # the table as last read or committed (one run writes it)
        # what the table at its current version says, read once: deltalake's lookup of an
        # application transaction walks them all (about 1 ms a lookup among 5,000 chunks)
        self.versions: dict[str, int] = {}
        self.live: set[str] | None = None

    def loaded(self) -> Any:
        """The table, or None while there is none."""
        from deltalake import DeltaTable

        if self.dt is None:
            try:
                if DeltaTable.is_deltatable(self.uri, storage_options=self.options):
                    self.dt = DeltaTable(self.uri, storage_options=self.options)
            except Exception as exc:  # deltalake's errors have no common root
                raise self.error("read", exc) from exc
        return self.dt

    def exists(self) -> bool:
        return self.loaded() is not None

    def holds_files(self) -> bool:
        return self.loaded() is not None and bool(self.loaded().file_uris())

    def fit(self, schema: pa.Schema) -> pa.Schema:
        return fit(schema)

    def check_takes(self, ours: pa.Schema | None, *, what: str = "") -> None:
        check(self.loaded(), ours, self.uri, what=what)

    def whose(self, names: set[str]) -> str:
        """Which of the log's commits took data files ``names`` out (`delta_log.by_whom`)."""
        return by_whom(self.store, self.loaded().version(), names)

    def scan(self, column: str) -> Iterator[pa.Array]:
        dataset = self.loaded().to_pyarrow_dataset() if self.exists() else None
        if dataset is None or column not in dataset.schema.names:
            return
        for batch in dataset.to_batches(columns=[column]):  # no filter: see `neighbours`
            yield batch.column(0)

    def version_of(self, key: str) -> int:
        """The chunk's application-transaction version: odd while its file is in the table."""
        dt = self.loaded()
        if dt is None:
            return 0
        if key not in self.versions:
            self.versions[key] = dt.transaction_version(app_id(key)) or 0
        return self.versions[key]

    def chunks(self) -> set[str]:
        """The chunks whose files the table holds (by name; another writer's files are not)."""
        if self.loaded() is None:
            return set()
        if self.live is None:
            paths = pa.table(self.loaded().get_add_actions(flatten=False)).column("path")
            self.live = {part_key(p) for p in paths.to_pylist() if is_chunk_name(p)}
        return self.live

    def handed(self, keys: Iterable[str]) -> set[str]:
        """Those of chunks ``keys`` another writer took over: in the table by their version
        (odd), their file not (see the module's note)."""
        if self.loaded() is None:
            return set()
        live = self.chunks()
        return {k for k in keys if k not in live and self.version_of(k) % 2 == 1}

    def append(
        self, files: list[tuple[str, FileFacts]], *, schema: pa.Schema, metadata: dict[str, str]
    ) -> None:
        """Add the published data files of chunks (key, facts) to the table in one transaction
        (the table is made first, with their ``schema``, if there is none); a chunk already in
        it is left as it is, so the transaction is never made twice."""
        from deltalake import Transaction

        schema = schema.remove_metadata()
        if self.loaded() is None:
            self.create(schema)
        fresh = [(key, facts) for key, facts in files if self.version_of(key) % 2 == 0]
        if not fresh:
            return
        mode, columns = self.mode_for(schema)
        now = int(time.time() * 1000)
        adds = [add_action(k, f.size, f.rows, now) for k, f in fresh]
        txns = [Transaction(app_id(k), self.version_of(k) + 1) for k, _ in fresh]
        info = self.info("append", [k for k, _ in fresh], metadata)
        self.commit(adds, txns, info, columns, mode=mode)

    def create(self, schema: pa.Schema) -> None:
        """Make the table, empty, with these columns (one that is there already is kept)."""
        from deltalake import DeltaTable

        try:
            DeltaTable.create(self.uri, schema, mode="ignore", storage_options=self.options)
        except Exception as exc:
            raise self.error("create", exc) from exc
        self.dt, self.versions, self.live = None, {}, None

    def mode_for(self, schema: pa.Schema) -> tuple[str, Any]:
        """How files of columns ``schema`` join the table, and under which columns: "append"
        under the table's own where they take them (columns another writer added are kept,
        `batchscore.output.delta_columns`); "overwrite" under ``schema`` where they do not
        and the table holds no file (after a ``--restart`` of a job whose columns changed: an
        append would keep the old columns and hide the new). Refused where it holds files."""
        dt = self.loaded()
        found = difference(fields_of(dt.schema()), delta_fields(schema))
        if found is None:
            return "append", dt.schema()
        if dt.file_uris():
            raise refusal(self.uri, found)
        return "overwrite", schema

    def retire(self, keys: Iterable[str]) -> int:
        """Take chunks ``keys`` out of the table (those still in it; returns how many were):
        the files it holds of theirs in one transaction, and the rows of those another writer
        took over, wherever they lie, in another (`take_back`); then their keys go."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        keys = list(dict.fromkeys(keys))
        inside = [k for k in keys if self.version_of(k) % 2 == 1]
        live = self.chunks() if inside else set()
        whole = [k for k in inside if k in live]
        if whole:
            now = int(time.time() * 1000)
            removes = [RemoveAction(part_name(k), True, now) for k in whole]
            txns = [Transaction(app_id(k), self.version_of(k) + 1) for k in whole]
            self.commit(removes, txns, self.info("delete", whole, {}), None)
        self.take_back([k for k in inside if k not in live])
        self.drop_keys(keys)
        return len(inside)

    def take_back(self, keys: list[str]) -> None:
        """Take the rows of chunks another writer took over out of the table, wherever they
        now lie, by their keys, in one merge that makes their versions even."""
        from deltalake import Transaction

        if not keys:
            return
        found = {key: read_keys(self.store, key) for key in keys}
        lacking = sorted(key for key, rows in found.items() if rows is None)
        if lacking:  # `batchscore.output.neighbours.check_keys` refuses it before any change
            raise WriteError(
                f"{self.uri}: another writer rewrote the files of chunk(s) {', '.join(lacking)} "
                "and batchscore has no keys to find their rows by in the Delta table"
            )
        txns = [Transaction(app_id(k), self.version_of(k) + 1) for k in keys]
        self.delete_keys([t for t in found.values() if t is not None], txns, keys)

    def delete_rows(self, leaving: dict[str, pa.Table]) -> None:
        """Take some rows of chunks another writer took over out of the table, in one merge
        (``leaving``: each chunk's rows that leave, as its keys name them); the chunks stay."""
        if leaving:
            self.delete_keys(list(leaving.values()), [], sorted(leaving))

    def delete_keys(self, found: list[pa.Table], txns: list[Any], keys: list[str]) -> None:
        """One merge that deletes the table's rows whose key columns equal a row of ``found``
        (another writer's own rows hold no row hash of batchscore's: by rows they never
        match), chunks ``keys``' application transactions ``txns`` with it. Where nothing
        matched, the merge commits nothing, and ``txns`` are committed alone."""
        from deltalake import CommitProperties

        dt, info = self.loaded(), self.info("delete", keys, {})
        names = found[0].column_names
        source = pa.concat_tables([t.select(names).replace_schema_metadata(None) for t in found])
        before = dt.version()
        if source.num_rows and set(names) <= set(fields_of(dt.schema())):
            on = " AND ".join(f"t.{quoted(name)} = s.{quoted(name)}" for name in names)
            properties = CommitProperties(custom_metadata=info, app_transactions=txns)
            try:
                merge = dt.merge(
                    source, on, source_alias="s", target_alias="t", commit_properties=properties
                )
                merge.when_matched_delete().execute()
            except Exception as exc:
                raise self.error("delete rows from", exc) from exc
            self.refresh()
        if txns and self.dt.version() == before:
            self.commit([], txns, info, None)

    def rewrite(self, old: str, new: str, *, size: int, rows: int) -> None:
        """Swap chunk ``old``'s file for chunk ``new``'s (``size`` bytes, ``rows`` rows: the
        old rows less those a retirement took, `batchscore.output.rewrite`) in one
        transaction: a remove and an add, both chunks' versions moved on, so Delta readers see
        the retired rows leave and nothing else. Done already, it does nothing. Where another
        writer took ``old``'s file over since (a kill, then a compaction), its rows leave by
        its keys first (`take_back`), and the new file joins after."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        if self.loaded() is None:
            return  # no table to follow: `reconcile` makes it from the records
        self.take_back(sorted(self.handed([old])))
        now, actions, txns = int(time.time() * 1000), [], []
        if (version := self.version_of(old)) % 2 == 1:
            actions.append(RemoveAction(part_name(old), True, now))
            txns.append(Transaction(app_id(old), version + 1))
        if (version := self.version_of(new)) % 2 == 0:
            actions.append(add_action(new, size, rows, now))
            txns.append(Transaction(app_id(new), version + 1))
        if actions:
            info = self.info("rewrite", [new], {}) | {"batchscore.replaces": [old]}
            self.commit(actions, txns, info, None)

    def out_of_step(self, committed: set[str]) -> tuple[set[str], set[str]]:
        """The chunk files the table holds that no ``committed`` chunk is (stray), and the
        committed chunks it lacks that batchscore never added (missing: version even)."""
        live = self.chunks()
        return live - committed, {k for k in committed - live if self.version_of(k) % 2 == 0}

    def mend(
        self, committed: dict[str, dict[str, Any]], *, stray: list[str], missing: set[str]
    ) -> None:
        """One transaction: ``stray`` chunk files out, the ``missing`` committed ones whose
        version is even (never in the log) in; those whose version is odd another writer took."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        missing_keys = sorted(k for k in missing if self.version_of(k) % 2 == 0)
        if not stray and not missing_keys:
            return
        log.warning(
            "%s: the Delta table held %d file(s) no commit record names and lacked %d "
            "committed one(s) batchscore added; mended",
            self.uri,
            len(stray),
            len(missing_keys),
        )
        now, actions, txns = int(time.time() * 1000), [], []
        for key in stray:
            actions.append(RemoveAction(part_name(key), True, now))
            txns.append(Transaction(app_id(key), after(self.version_of(key), odd=False)))
        for key in missing_keys:
            record = committed[key]
            actions.append(add_action(key, record["size"], record["rows"], now))
            txns.append(Transaction(app_id(key), after(self.version_of(key), odd=True)))
        info = self.info("reconcile", missing_keys, {}) | {"batchscore.removed": stray}
        self.commit(actions, txns, info, None)

    def kept(self) -> set[str]:
        """The chunks whose keys are kept (`batchscore.output.keys`)."""
        return kept_chunks(self.store)

    def drop_keys(self, keys: Iterable[str]) -> None:
        """Delete the keys of chunks out of the table (a missing one is fine)."""
        drop_chunk_keys(self.store, keys)

    def retire_files(self, rels: Iterable[str]) -> None:
        """`retire` the chunks whose data files or keys ``rels`` name (other names are not
        the table's): called before any of them is deleted or moved."""
        self.retire(chunks_named(rels))

    def info(self, operation: str, keys: list[str], metadata: dict[str, str]) -> dict[str, Any]:
        """A commit's custom metadata: the lineage, what it did, to which chunks."""
        lineage = {k: v for k, v in {**self.lineage, **metadata}.items() if k in LINEAGE}
        return {**lineage, "batchscore.operation": operation, "batchscore.chunks": keys}

    def commit(
        self,
        actions: list[Any],
        txns: list[Any],
        info: dict[str, Any],
        schema: Any,
        *,
        mode: str = "append",
    ) -> None:
        """One transaction: the file actions, the chunks' application transactions, the info,
        under columns ``schema`` (None: the table's)."""
        from deltalake import CommitProperties

        dt = self.loaded()
        properties = CommitProperties(custom_metadata=info, app_transactions=txns)
        try:
            dt.create_write_transaction(
                actions, mode, schema or dt.schema(), commit_properties=properties
            )
        except Exception as exc:
            raise self.error("commit to", exc) from exc
        self.refresh()

    def refresh(self) -> None:
        """Read the log's new versions (only those: the table is not read again whole)."""
        self.versions, self.live = {}, None
        try:
            self.dt.update_incremental()
        except Exception as exc:
            raise self.error("read", exc) from exc

    def error(self, doing: str, exc: Exception) -> WriteError:
        return WriteError(f"{self.uri}: cannot {doing} the Delta table: {exc}")


def add_action(key: str, size: int, rows: int, now: int) -> Any:
    """The log's entry adding a chunk's data file (its row count as the file's statistics)."""
    from deltalake.transaction import AddAction

    return AddAction(part_name(key), size, {}, now, True, json.dumps({"numRecords": rows}))


def quoted(name: str) -> str:
    """A column's name as a Delta predicate (SQL) names it, whatever its case or characters."""
    return '"' + name.replace('"', '""') + '"'
