"""An output folder that is an Apache Iceberg table (``[output].format = "iceberg"``), over
`pyiceberg`: the same contract as the Delta table (`batchscore.output.delta`), method for method.

The commit protocol stays the folder's own (`batchscore.output.committer`): a chunk's data file
is staged, checked and published under its chunk's name, and its commit record is the commit
point. In between, one Iceberg commit adds the group's files to the table (pyiceberg's
``add_files`` path: batchscore's own Parquet files, which carry no field ids, read by the
table's name mapping): one snapshot per commit group. From then on Iceberg readers (pyiceberg,
DuckDB's ``iceberg_scan``, polars' ``scan_iceberg``, Spark, Trino) see its rows.

Each commit is idempotent per chunk. Iceberg has no application transactions; a snapshot's
summary could carry them, but another tool's ``expire_snapshots`` deletes old snapshots with
their summaries. So each chunk's state is a table property (``batchscore.chunk.<key>``: a
version, odd while its file is in the table, even or absent while not), set in the same
commit as the files it adds or removes: one new metadata file, swapped in atomically by the
catalog. Table properties live in every metadata file and survive expired snapshots,
compaction and schema changes. Adding a chunk whose version is odd, or removing one whose
version is even, does nothing: a run killed between an Iceberg commit and its commit records
never appends a chunk twice.

Another writer's commits are the table's truth, as for Delta: a chunk whose version is odd
but whose file the current snapshot no longer holds as batchscore wrote it (compacted or
rewritten away, or with delete files against it) was taken over (`Table.handed`), and its
rows leave, when they must, by the chunk's keys (`batchscore.output.keys`): batchscore reads
the files that may hold them, drops the matching rows (an exact match on the id, and by rows
the row hash) and swaps each file for its kept rows in one overwrite snapshot
(`Table.delete_keys`), so another writer's rows are never touched. Retirement removes whole
chunk files in one overwrite snapshot; `Table.rewrite` swaps a file for its kept rows under a
new chunk key. Each snapshot's summary carries the lineage (the job, the model, the
precision, the batchscore version) and which chunks it added or removed, for as long as the
snapshot is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from batchscore.errors import JobError, WriteError, write_error
from batchscore.job.sections import Job
from batchscore.output.contents import LINEAGE, lineage
from batchscore.output.format import after
from batchscore.output.iceberg_catalog import (
    IDENTIFIER,
    create,
    file_io,
    identifier_of,
    load,
    location,
    open_catalog,
    write_hint,
)
from batchscore.output.iceberg_columns import difference, fit, refusal, replace_columns
from batchscore.output.iceberg_log import by_whom
from batchscore.output.iceberg_rows import files_without, write_rows
from batchscore.output.keys import chunks_named, drop_chunk_keys, kept_chunks, read_keys
from batchscore.output.manifest import FileFacts
from batchscore.storage.layout import is_chunk_name, part_key, part_name
from batchscore.storage.store import Store

log = logging.getLogger("batchscore")
EXTRA = "pip install 'batchscore[iceberg]'"
CHUNK = "batchscore.chunk."  # a table property per chunk: its version (odd: in the table)


def iceberg_table(job: Job, store: Store, env: Mapping[str, str]) -> Table:
    """The job's output as an Iceberg table (the format table's "iceberg" entry), in the
    catalog `[output].catalog` names (none: its own, `iceberg_catalog`); ``env``: the
    environment whose ``AWS_*`` variables reach an object store."""
    catalog = dict(job.output.catalog) or None
    return Table(
        store,
        lineage=lineage(job),
        id_column=job.input.id,
        catalog=catalog,
        identifier=job.output.table_name,
        env=env,
    )


class Table:
    """The Iceberg table at an output folder (created by the first commit that adds files).

    ``lineage`` goes into every snapshot's summary; an append adds its data files' metadata.
    ``id_column``: the job's `[input].id`, whose values (with the row hash, by rows) find a
    chunk's rows once another writer took them over. ``catalog``: pyiceberg's properties of
    the catalog the table is in (None: its own SQL catalog, `iceberg_catalog`), and
    ``identifier`` its name there; ``env``: where the ``AWS_*`` variables are read from.
    The format table's "iceberg" entry (`batchscore.output.format.OutputFormat`).
    """

    name = "iceberg"
    title = "the Iceberg table"
    rewrites_in_place = False  # a snapshot names each file once, with its size and rows

    def __init__(
        self,
        store: Store,
        *,
        lineage: dict[str, str],
        id_column: str | None = None,
        catalog: Mapping[str, str] | None = None,
        identifier: str = IDENTIFIER,
        env: Mapping[str, str] | None = None,
    ) -> None:
        try:
            import pyiceberg  # noqa: F401  (optional: the `iceberg` extra)
        except ImportError:
            raise JobError(
                f'[output].format = "iceberg" needs the pyiceberg package: {EXTRA}'
            ) from None
        self.store, self.lineage, self.id_column = store, lineage, id_column
        self.uri = location(store)  # where the table and batchscore's data files lie
        self.io = file_io(self.uri, env or {})
        self.catalog_properties, self.identifier = catalog, identifier_of(identifier)
        self.catalog: Any = None
        self.table: Any = None  # as last read or committed (one run writes it)
        self.tasks: dict[str, Any] | None = None  # the current snapshot's files, by path

    def loaded(self) -> Any:
        """The table (a `pyiceberg.table.Table`), or None while there is none."""
        if self.table is None:
            try:
                if self.catalog is None:
                    self.catalog = open_catalog(self.store, self.catalog_properties, self.io)
                self.table = load(self.catalog, self.identifier, self.store)
            except Exception as exc:  # pyiceberg's errors have no common root
                raise self.error("read", exc) from exc
        return self.table

    def version_of(self, key: str) -> int:
        """The chunk's version, a table property: odd while its file is in the table."""
        table = self.loaded()
        found = table.properties.get(CHUNK + key, "0") if table is not None else "0"
        return int(found) if found.isdigit() else 0

    def path_of(self, key: str) -> str:
        """A chunk's data file as the table names it."""
        return f"{self.uri}/{part_name(key)}"

    def key_of(self, path: str) -> str | None:
        """The chunk whose data file ``path`` is (None: not a file batchscore names so)."""
        folder, _, name = path.rpartition("/")
        return part_key(name) if folder == self.uri and is_chunk_name(name) else None

    def files(self) -> dict[str, Any]:
        """The current snapshot's data files (path -> pyiceberg's scan task, which names the
        delete files that apply to it)."""
        if self.tasks is None:
            table = self.loaded()
            self.tasks = {}
            if table is not None and table.current_snapshot() is not None:
                try:
                    self.tasks = {t.file.file_path: t for t in table.scan().plan_files()}
                except Exception as exc:
                    raise self.error("read", exc) from exc
        return self.tasks

    def chunks(self) -> set[str]:
        """The chunks whose files the table holds as batchscore wrote them (no delete file
        of another writer's against them); another writer's files are not chunks."""
        found = ((self.key_of(path), task) for path, task in self.files().items())
        return {key for key, task in found if key is not None and not task.delete_files}

    def handed(self, keys: Iterable[str]) -> set[str]:
        """Those of chunks ``keys`` another writer took over: in the table by their version
        (odd), their file not (as batchscore wrote it)."""
        if self.loaded() is None:
            return set()
        live = self.chunks()
        return {k for k in keys if k not in live and self.version_of(k) % 2 == 1}

    def whose(self, names: set[str]) -> str:
        """Which snapshots took data files ``names`` (the folder's) out, in words."""
        try:
            return by_whom(self.loaded(), {f"{self.uri}/{name}" for name in names})
        except Exception as exc:  # never a reason to stop a run: said as unknown
            return f"a snapshot not read ({exc})"

    def exists(self) -> bool:
        return self.loaded() is not None

    def fit(self, schema: pa.Schema) -> pa.Schema:
        return fit(schema)

    def scan(self, column: str) -> Iterator[pa.Array]:
        """Every value of ``column`` the table's readers see, a file's batch at a time."""
        table = self.loaded()
        if table is None or column not in table.schema().column_names:
            return
        try:
            for batch in table.scan(selected_fields=(column,)).to_arrow_batch_reader():
                yield batch.column(0)
        except Exception as exc:  # pyiceberg's errors have no common root
            raise self.error("read", exc) from exc

    def holds_files(self) -> bool:
        """Whether the table holds any data file (anyone's)."""
        return bool(self.files())

    def append(
        self, files: list[tuple[str, FileFacts]], *, schema: pa.Schema, metadata: dict[str, str]
    ) -> None:
        """Add the published data files of chunks (key, facts) to the table in one snapshot
        (the table is made first, with their ``schema``, if there is none); a chunk already in
        it is left as it is, so the commit is never made twice."""
        schema = schema.remove_metadata()
        if self.loaded() is None:
            self.create(schema)
        fresh = [key for key, _ in files if self.version_of(key) % 2 == 0]
        if not fresh:
            return
        _, columns = self.mode_for(schema)
        self.commit(
            add=[self.path_of(k) for k in fresh],
            marks={k: self.version_of(k) + 1 for k in fresh},
            info=self.info("append", fresh, metadata),
            columns=columns,
        )

    def create(self, schema: pa.Schema) -> None:
        """Make the table, empty, with these columns (one that is there already is kept)."""
        try:
            if self.catalog is None:
                self.catalog = open_catalog(self.store, self.catalog_properties, self.io)
            self.table = create(self.catalog, self.identifier, self.store, schema)
        except Exception as exc:
            raise self.error("create", exc) from exc
        self.tasks = None
        self.hint()

    def mode_for(self, schema: pa.Schema) -> tuple[str, pa.Schema | None]:
        """How files of columns ``schema`` join the table, and the columns it must take first:
        "append" under the table's own where they take them (None: columns another writer
        added are kept); "overwrite" with ``schema`` where they do not and the table holds no
        file (after a ``--restart`` of a job whose columns changed). Refused where it holds
        files."""
        found = difference(self.loaded().schema().as_arrow(), schema)
        if found is None:
            return "append", None
        if self.holds_files():
            raise refusal(self.uri, found)
        return "overwrite", schema

    def check_takes(self, ours: pa.Schema | None, *, what: str = "") -> None:
        """Refuse (`WriteError`) a table whose columns no longer take files of columns
        ``ours`` (None: nothing to check against; ``what`` says whose)."""
        if ours is None or self.loaded() is None:
            return
        found = difference(self.loaded().schema().as_arrow(), ours)
        if found is not None:
            raise refusal(self.uri, found, what=what)

    def retire(self, keys: Iterable[str]) -> int:
        """Take chunks ``keys`` out of the table (those still in it; returns how many were):
        the files it holds of theirs in one snapshot, and the rows of those another writer
        took over, wherever they lie, in another (`take_back`); then their keys go."""
        keys = list(dict.fromkeys(keys))
        inside = [k for k in keys if self.version_of(k) % 2 == 1]
        live = self.chunks() if inside else set()
        whole = [k for k in inside if k in live]
        if whole:
            self.commit(
                remove=[self.path_of(k) for k in whole],
                marks={k: self.version_of(k) + 1 for k in whole},
                info=self.info("delete", whole, {}),
            )
        self.take_back([k for k in inside if k not in live])
        self.drop_keys(keys)
        return len(inside)

    def take_back(self, keys: list[str]) -> None:
        """Take the rows of chunks another writer took over out of the table, wherever they
        now lie, by their keys, in one snapshot that makes their versions even."""
        if not keys:
            return
        found = {key: read_keys(self.store, key) for key in keys}
        lacking = sorted(key for key, rows in found.items() if rows is None)
        if lacking:  # the format's check of keys refuses it before any change
            raise WriteError(
                f"{self.uri}: another writer rewrote the files of chunk(s) {', '.join(lacking)} "
                "and batchscore has no keys to find their rows by in the Iceberg table"
            )
        marks = {k: self.version_of(k) + 1 for k in keys}
        self.delete_keys([t for t in found.values() if t is not None], marks, keys)

    def delete_rows(self, leaving: dict[str, pa.Table]) -> None:
        """Take some rows of chunks another writer took over out of the table, in one
        snapshot (``leaving``: each chunk's rows that leave, as its keys name them); the
        chunks stay."""
        if leaving:
            self.delete_keys(list(leaving.values()), {}, sorted(leaving))

    def delete_keys(self, found: list[pa.Table], marks: dict[str, int], keys: list[str]) -> None:
        """One commit that deletes the table's rows whose key columns equal a row of
        ``found`` (another writer's own rows hold no row hash of batchscore's: by rows they
        never match), with chunks ``keys``' new versions ``marks``: each file that holds such
        a row is swapped for a file of its other rows (`batchscore.output.iceberg_rows`).
        Where nothing matched, only the versions are committed."""
        table, names = self.loaded(), found[0].column_names
        source = pa.concat_tables([t.select(names).replace_schema_metadata(None) for t in found])
        removed, added = [], []
        if source.num_rows and set(names) <= set(table.schema().column_names):
            for path, kept in self.rows_without(source).items():
                removed.append(path)
                if kept.num_rows:
                    added.append(write_rows(self.store, self.uri, kept, self.lineage))
        if removed or marks:
            self.commit(add=added, remove=removed, marks=marks, info=self.info("delete", keys, {}))

    def rows_without(self, source: pa.Table) -> dict[str, pa.Table]:
        """Each data file holding a row of ``source``'s keys, and its other rows."""
        try:
            return files_without(self.loaded(), source)
        except Exception as exc:  # pyiceberg's errors have no common root
            raise self.error("read", exc) from exc

    def rewrite(self, old: str, new: str, *, size: int, rows: int) -> None:
        """Swap chunk ``old``'s file for chunk ``new``'s (``size`` bytes, ``rows`` rows: the
        old rows less those a retirement took) in one snapshot, both chunks' versions moved
        on. Done already, it does nothing. Where another writer took ``old``'s file over since,
        its rows leave by its keys first (`take_back`), and the new file joins after."""
        if self.loaded() is None:
            return  # no table to follow: the start's reconciliation makes it from the records
        self.take_back(sorted(self.handed([old])))
        add, remove, marks = [], [], {}
        if (version := self.version_of(old)) % 2 == 1:
            remove.append(self.path_of(old))
            marks[old] = version + 1
        if (version := self.version_of(new)) % 2 == 0:
            add.append(self.path_of(new))
            marks[new] = version + 1
        if marks:
            info = self.info("rewrite", [new], {}) | {"batchscore.replaces": json.dumps([old])}
            self.commit(add=add, remove=remove, marks=marks, info=info)

    def out_of_step(self, committed: set[str]) -> tuple[set[str], set[str]]:
        """The chunk files the table holds that no ``committed`` chunk is (stray), and the
        committed chunks it lacks that batchscore never added (missing: version even)."""
        live = self.chunks()
        return live - committed, {k for k in committed - live if self.version_of(k) % 2 == 0}

    def mend(
        self, committed: dict[str, dict[str, Any]], *, stray: list[str], missing: set[str]
    ) -> None:
        """One snapshot: ``stray`` chunk files out, the ``missing`` committed ones whose
        version is even (never in the table) in; those whose version is odd another writer
        took over. The folder's version hint then names the table's current metadata file:
        another writer commits through the catalog, which writes no hint, and a reader of the
        folder alone would read the table as batchscore last left it (without that writer's
        rows, with the rows it deleted) after a run that commits nothing."""
        if self.loaded() is not None:
            self.hint()
        missing = sorted(k for k in missing if self.version_of(k) % 2 == 0)
        versions = {k: after(self.version_of(k), odd=False) for k in stray}
        versions |= {k: after(self.version_of(k), odd=True) for k in missing}
        if stray or missing:
            log.warning(
                "%s: the Iceberg table held %d file(s) no commit record names and lacked %d "
                "committed one(s) batchscore added; mended",
                self.uri,
                len(stray),
                len(missing),
            )
            info = self.info("reconcile", missing, {}) | {"batchscore.removed": json.dumps(stray)}
            paths = [self.path_of(k) for k in missing]
            self.commit(
                add=paths, remove=[self.path_of(k) for k in stray], marks=versions, info=info
            )

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

    def info(self, operation: str, keys: list[str], metadata: dict[str, str]) -> dict[str, str]:
        """A snapshot's summary properties: the lineage, what it did, to which chunks (a
        summary holds strings only: the chunks as a JSON list)."""
        lineage = {k: v for k, v in {**self.lineage, **metadata}.items() if k in LINEAGE}
        return {**lineage, "batchscore.operation": operation, "batchscore.chunks": json.dumps(keys)}

    def commit(
        self,
        *,
        add: list[str] = (),  # type: ignore[assignment]
        remove: list[str] = (),  # type: ignore[assignment]
        marks: dict[str, int],
        info: dict[str, str],
        columns: pa.Schema | None = None,
    ) -> None:
        """One Iceberg commit: the table's columns made ``columns`` (None: kept), the chunks'
        versions ``marks`` set, and (where files change) one snapshot that removes the files
        ``remove`` and adds the files ``add`` (paths as the table names them), with ``info``
        in its summary. A commit of versions alone makes no snapshot."""
        from pyiceberg.io.pyarrow import parquet_files_to_data_files
        from pyiceberg.table import TableProperties

        table, tasks = self.loaded(), self.files()
        try:
            with table.transaction() as tx:
                if columns is not None:
                    replace_columns(tx, columns)
                if marks:
                    tx.set_properties({CHUNK + k: str(v) for k, v in marks.items()})
                if add and tx.table_metadata.name_mapping() is None:  # files carry no ids
                    mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
                    tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
                if add or remove:
                    update = tx.update_snapshot(snapshot_properties=info)
                    with update.overwrite() if remove else update.fast_append() as snapshot:
                        for path in remove:
                            snapshot.delete_data_file(tasks[path].file)
                        for data_file in parquet_files_to_data_files(
                            table.io, tx.table_metadata, iter(add)
                        ):
                            snapshot.append_data_file(data_file)
        except Exception as exc:
            raise self.error("commit to", exc) from exc
        self.refresh()

    def refresh(self) -> None:
        """Read the table's newest metadata (after a commit, or another writer's)."""
        self.tasks = None
        try:
            self.table = self.loaded().refresh()
        except Exception as exc:
            raise self.error("read", exc) from exc
        self.hint()

    def hint(self) -> None:
        """Point the folder's version hint at the current metadata file."""
        try:
            write_hint(self.store, self.table.metadata_location)
        except OSError as exc:
            raise write_error(self.store.where("metadata"), exc) from exc

    def error(self, doing: str, exc: Exception) -> WriteError:
        return WriteError(f"{self.uri}: cannot {doing} the Iceberg table: {exc}")
