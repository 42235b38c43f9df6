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

Retired output (a shard that left the input, a chunk un-committed, a ``--restart``) becomes a
Delta delete: `Table.retire` removes whole chunks (one transaction for a whole retirement). By
rows, a file some of whose rows retire is never rewritten in place (the log names each file
once, with its size and rows): its kept rows go to a new file under a new chunk key, and
`Table.rewrite` swaps the two in one transaction (`batchscore.output.rewrite`), so the table's
files and the committed chunks' files stay one set; `Table.reconcile` mends them at a run's
start if anything left them apart. Each commit's info carries the lineage: the job, the model,
the precision and the batchscore version (``custom_metadata``, as ``DeltaTable.history()``
shows it), and which chunks it added or removed.

Delta has no fixed-size lists and no unsigned integers, so a table's schema lists vectors as
lists and widens unsigned integers to the next signed type (`fit`); the Parquet footers still
carry batchscore's metadata. An object-store table uses the store's standard credentials and
endpoint (for S3 the ``AWS_*`` variables, as the Parquet output does), read by `deltalake`
itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore.errors import JobError, WriteError
from batchscore.job.sections import Job
from batchscore.output.contents import lineage
from batchscore.output.manifest import FileFacts
from batchscore.storage.layout import is_chunk_name, part_key, part_name
from batchscore.storage.store import Store

log = logging.getLogger("batchscore")
EXTRA = "pip install 'batchscore[delta]'"
WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def app_id(key: str) -> str:
    """A chunk's application-transaction id in the table's log."""
    return f"batchscore-{key}"


def fit(schema: pa.Schema) -> pa.Schema:
    """The output schema as a Delta table holds it: fixed-size lists as lists, unsigned
    integers widened (a uint64 column has no Delta type and is refused); metadata kept."""
    return pa.schema([field.with_type(delta_type(field)) for field in schema], schema.metadata)


def delta_type(field: pa.Field) -> pa.DataType:
    """A column's type as Delta holds it (nested types converted throughout)."""
    kind = field.type
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        return pa.list_(field.with_type(delta_type(kind.value_field)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(delta_type(f)) for f in kind])
    if kind == pa.uint64():
        raise JobError(
            f'[output].format = "delta": column {field.name!r} is uint64, which Delta Lake '
            "cannot hold; cast it in the input, or write Parquet"
        )
    return WIDER.get(kind, kind)


def storage_options(url: str) -> dict[str, str]:
    """What `deltalake` needs beyond the store's standard chain: plain-HTTP endpoints (an
    ``AWS_ENDPOINT_URL`` on loopback) are allowed, as pyarrow's filesystems allow them."""
    return {"allow_http": "true"} if urlsplit(url).scheme in ("s3", "s3a") else {}


def delta_table(job: Job, store: Store) -> Table | None:
    """The job's output as a Delta table, where `[output].format` asks for one (None for a
    folder of Parquet files alone)."""
    if job.output.format != "delta":
        return None
    return Table(store, lineage=lineage(job))


class Table:
    """The Delta table at an output folder (created by the first commit that adds files).

    ``lineage`` goes into every commit's info; an append adds its data files' metadata.
    """

    def __init__(self, store: Store, *, lineage: dict[str, str]) -> None:
        try:
            import deltalake  # noqa: F401  (optional: the `delta` extra)
        except ImportError:
            raise JobError(
                f'[output].format = "delta" needs the deltalake package: {EXTRA}'
            ) from None
        self.store, self.lineage = store, lineage
        self.uri = str(store.url)  # a local folder's path, or the store's URL
        self.options = storage_options(self.uri)
        self.dt: Any = None  # the table as last read or committed (one run writes it)

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

    def version_of(self, key: str) -> int:
        """The chunk's application-transaction version: odd while its file is in the table."""
        dt = self.loaded()
        return (dt.transaction_version(app_id(key)) or 0) if dt is not None else 0

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
        now = int(time.time() * 1000)
        adds = [add_action(k, f.size, f.rows, now) for k, f in fresh]
        txns = [Transaction(app_id(k), self.version_of(k) + 1) for k, _ in fresh]
        info = self.info("append", [k for k, _ in fresh], metadata)
        self.commit(adds, txns, info, schema, mode=self.mode_for(schema))

    def create(self, schema: pa.Schema) -> None:
        """Make the table, empty, with these columns (one that is there already is kept)."""
        from deltalake import DeltaTable

        try:
            DeltaTable.create(self.uri, schema, mode="ignore", storage_options=self.options)
        except Exception as exc:
            raise self.error("create", exc) from exc
        self.dt = None

    def mode_for(self, schema: pa.Schema) -> str:
        """ "append" while the table's columns are ``schema``'s; "overwrite" (which takes the
        new columns) where they differ and the table holds no file (after a ``--restart`` of
        a job whose columns changed: an append would keep the old columns and hide the new).
        Columns that differ under live files are refused: this run's would not read."""
        from deltalake import Schema

        dt = self.loaded()
        if Schema.from_arrow(schema).to_json() == dt.schema().to_json():
            return "append"
        if dt.file_uris():
            raise WriteError(
                f"{self.uri}: the Delta table's columns differ from this job's output and it "
                "holds rows; run with --restart to start over, or point [output].path elsewhere"
            )
        return "overwrite"

    def retire(self, keys: Iterable[str]) -> int:
        """Take the whole files of chunks ``keys`` out of the table, as one transaction (those
        still in it; returns how many were)."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        keys = list(dict.fromkeys(keys))
        if not keys or self.loaded() is None:
            return 0
        live = [k for k in keys if self.version_of(k) % 2 == 1]
        if not live:
            return 0
        now = int(time.time() * 1000)
        removes = [RemoveAction(part_name(k), True, now) for k in live]
        txns = [Transaction(app_id(k), self.version_of(k) + 1) for k in live]
        self.commit(removes, txns, self.info("delete", live, {}), None)
        return len(live)

    def rewrite(self, old: str, new: str, *, size: int, rows: int) -> None:
        """Swap chunk ``old``'s file for chunk ``new``'s (``size`` bytes, ``rows`` rows: the
        old rows less those a retirement took, `batchscore.output.rewrite`) in one
        transaction: a remove and an add, both chunks' versions moved on, so Delta readers see
        the retired rows leave and nothing else. Done already, it does nothing."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        if self.loaded() is None:
            return  # no table to follow: `reconcile` makes it from the records
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

    def reconcile(self, committed: dict[str, dict[str, Any]]) -> None:
        """Make the table's batchscore files the ``committed`` chunks' files (records whose
        files are intact), in one transaction: a chunk file the table holds with no record
        leaves it, and a record's file it lacks joins it (the table is made from the first
        one's columns if there is none). A run keeps the two in step itself; this mends what
        a kill at an unforeseen moment, or a hand on the log, left apart."""
        from deltalake import Transaction
        from deltalake.transaction import RemoveAction

        if self.loaded() is None:
            if not committed:
                return
            first = committed[min(committed)]["file"]
            try:
                with self.store.open_input(first) as fh:
                    schema = pq.read_schema(fh)
            except (OSError, pa.ArrowException) as exc:
                raise self.error(f"read {first} to make", exc) from exc
            self.create(fit(schema).remove_metadata())
        live = self.chunks()
        stray, missing = sorted(live - set(committed)), sorted(set(committed) - live)
        if not stray and not missing:
            return
        log.warning(
            "%s: the Delta table held %d file(s) no commit record names and lacked %d "
            "committed one(s); mended",
            self.uri,
            len(stray),
            len(missing),
        )
        now, actions, txns = int(time.time() * 1000), [], []
        for key in stray:
            actions.append(RemoveAction(part_name(key), True, now))
            txns.append(Transaction(app_id(key), after(self.version_of(key), odd=False)))
        for key in missing:
            record = committed[key]
            actions.append(add_action(key, record["size"], record["rows"], now))
            txns.append(Transaction(app_id(key), after(self.version_of(key), odd=True)))
        info = self.info("reconcile", missing, {}) | {"batchscore.removed": stray}
        self.commit(actions, txns, info, None)

    def chunks(self) -> set[str]:
        """The chunks whose files the table holds (by name; another writer's files are not)."""
        paths = pa.table(self.loaded().get_add_actions(flatten=False)).column("path")
        return {part_key(p) for p in paths.to_pylist() if is_chunk_name(p)}

    def retire_files(self, rels: Iterable[str]) -> None:
        """`retire` the chunks whose data files ``rels`` name (other names are not the
        table's): called before any of them is deleted or moved."""
        self.retire(k for rel in rels if "/" not in rel and (k := part_key(rel)) is not None)

    def info(self, operation: str, keys: list[str], metadata: dict[str, str]) -> dict[str, Any]:
        """A commit's custom metadata: the lineage, what it did, to which chunks."""
        lineage = {k: v for k, v in {**self.lineage, **metadata}.items() if k in LINEAGE}
        return {**lineage, "batchscore.operation": operation, "batchscore.chunks": keys}

    def commit(
        self,
        actions: list[Any],
        txns: list[Any],
        info: dict[str, Any],
        schema: pa.Schema | None,
        *,
        mode: str = "append",
    ) -> None:
        """One transaction: the file actions, the chunks' application transactions, the info."""
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


def after(version: int, *, odd: bool) -> int:
    """The next application-transaction version above ``version`` that is odd (the chunk's
    file in the table) or even (out of it)."""
    return version + 1 if version % 2 != odd else version + 2


# what of the data files' metadata goes into each commit's info
LINEAGE = (
    "batchscore.version",
    "batchscore.job",
    "batchscore.task",
    "batchscore.model",
    "batchscore.model_files",
    "batchscore.precision",
    "batchscore.fingerprint",
)
