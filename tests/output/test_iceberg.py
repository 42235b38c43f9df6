"""``[output].format = "iceberg"``: `batchscore.output.iceberg.Table` over real files and a real
pyiceberg SQL catalog on SQLite. Each commit group is one snapshot, idempotent per chunk
through the chunks' versions (table properties set in the same commit), which survive another
tool's ``expire_snapshots``; retirements are overwrite snapshots; each summary names its
lineage; pyiceberg, DuckDB's ``iceberg_scan`` and polars' ``scan_iceberg`` read the rows
committed, from the catalog or from the folder alone."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from batchscore.errors import JobError, WriteError
from batchscore.storage.disk import LocalStore
from batchscore.storage.layout import CATALOG, part_name, successor_key

pyiceberg = pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg (dev extra)")

from batchscore.output.iceberg import CHUNK, Table  # noqa: E402
from batchscore.output.iceberg_columns import fit  # noqa: E402
from tests.output.iceberg_tables import (  # noqa: E402
    FITTED,
    duckdb_rows,
    key,
    read_all,
    rows_of,
    table_at,
    write_chunk,
)


@pytest.fixture(autouse=True)
def quiet_polars(monkeypatch):
    """polars plans an Iceberg scan through pyiceberg here (its own planner is another
    package), and says so in a warning unless told."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")


def summaries(table: Table) -> list[dict[str, str]]:
    """Each snapshot's summary, oldest first, with its operation."""
    return [
        {**s.summary.additional_properties, "operation": s.summary.operation.value}
        for s in table.loaded().refresh().snapshots()
    ]


def test_adding_or_removing_a_chunk_twice_commits_once(tmp_path: Path):
    """A second `append` or `retire` of the same chunks (a retry, a resumed step) changes
    nothing: the chunk's version, a table property, is odd while its file is in the table."""
    out = tmp_path / "out"
    table = table_at(out)
    files = [write_chunk(out, key("a"), rows_of(["a-0", "a-1"]))]
    for _ in range(2):
        table.append(files, schema=FITTED, metadata={"batchscore.model": "m"})
    assert len(table.loaded().snapshots()) == 1 and table.version_of(key("a")) == 1
    assert [i for i, _ in read_all(out, table)] == ["a-0", "a-1"]
    assert table.chunks() == {key("a")}
    assert table.retire([key("a")]) == 1 and table.retire([key("a")]) == 0
    assert table.version_of(key("a")) == 2 and read_all(out, table) == []
    assert not (out / "_batchscore/keys").exists() or not list((out / "_batchscore/keys").iterdir())
    table.append(files, schema=FITTED, metadata={})  # back in: a new version, odd again
    assert table.version_of(key("a")) == 3 and len(read_all(out, table)) == 2
    first, removed, again = summaries(table)
    assert first["operation"] == "append" and first["batchscore.job"] == "unit"
    assert first["batchscore.model"] == "m"
    assert json.loads(first["batchscore.chunks"]) == [key("a")]
    assert removed["batchscore.operation"] == "delete" and removed["operation"] == "overwrite"
    assert again["batchscore.operation"] == "append"


def test_a_commit_group_is_one_snapshot_and_one_metadata_file(tmp_path: Path):
    """A group's files and its chunks' versions land together: one snapshot, one new
    metadata file (the catalog's pointer moved once), so a kill leaves both or neither."""
    out = tmp_path / "out"
    table = table_at(out)
    files = [write_chunk(out, key(s), rows_of([f"{s}-0", f"{s}-1"])) for s in "abc"]
    table.append(files[:1], schema=FITTED, metadata={})
    before = sorted((out / "metadata").glob("*.metadata.json"))
    table.append(files, schema=FITTED, metadata={})
    after = sorted((out / "metadata").glob("*.metadata.json"))
    assert len(after) == len(before) + 1
    [group] = summaries(table)[1:]
    assert sorted(json.loads(group["batchscore.chunks"])) == sorted([key("b"), key("c")])
    assert group["added-data-files"] == "2"
    props = table.loaded().properties
    assert {k: props[CHUNK + k] for k in (key("a"), key("b"), key("c"))} == dict.fromkeys(
        (key("a"), key("b"), key("c")), "1"
    )


def test_swapping_a_rewritten_file_commits_once(tmp_path: Path):
    """`Table.rewrite`: one overwrite snapshot removes the old file and adds the new (the old
    rows less the retired), both chunks' versions moved on, the lineage and what it replaces
    in its summary; a second call changes nothing."""
    out = tmp_path / "out"
    table = table_at(out)
    old = key("a")
    new = successor_key(old, "r")
    table.append(
        [write_chunk(out, old, rows_of(["a-0", "a-1", "a-2"]))], schema=FITTED, metadata={}
    )
    _, facts = write_chunk(out, new, rows_of(["a-0", "a-2"]))
    for _ in range(2):
        table.rewrite(old, new, size=facts.size, rows=facts.rows)
    assert [i for i, _ in read_all(out, table)] == ["a-0", "a-2"]
    assert table.version_of(old) == 2 and table.version_of(new) == 1
    assert table.chunks() == {new}
    swap = summaries(table)[-1]
    assert len(summaries(table)) == 2 and swap["batchscore.operation"] == "rewrite"
    assert json.loads(swap["batchscore.replaces"]) == [old]
    assert json.loads(swap["batchscore.chunks"]) == [new] and swap["batchscore.job"] == "unit"


def test_every_reader_reads_the_committed_rows(tmp_path: Path):
    """pyiceberg (through the catalog and from the folder alone, by the version hint),
    polars and DuckDB (by the folder, and by the metadata file) read the same rows; the
    vectors read as lists, the unsigned labels as Iceberg ints."""
    out = tmp_path / "out"
    table = table_at(out)
    a, b = rows_of([f"a-{i}" for i in range(5)]), rows_of(["b-0", "b-1"], seed=3)
    table.append([write_chunk(out, key("a"), a)], schema=FITTED, metadata={})
    table.append([write_chunk(out, key("b"), b)], schema=FITTED, metadata={})
    want = sorted(
        zip(
            a["id"].to_pylist() + b["id"].to_pylist(),
            a["scores"].to_pylist() + b["scores"].to_pylist(),
            strict=True,
        )
    )
    assert read_all(out, table) == want
    metadata = table.loaded().metadata_location
    assert [(i, list(s)) for i, s in duckdb_rows(metadata)] == want
    labels = duckdb_rows(str(out), "label")
    assert labels == sorted((v,) for v in a["label"].to_pylist() + b["label"].to_pylist())
    schema = table.loaded().schema()
    assert str(schema.find_field("scores").field_type) == "list<float>"
    assert str(schema.find_field("label").field_type) == "int"


def test_chunk_versions_survive_expired_snapshots(tmp_path: Path):
    """Another tool expires every snapshot but the current: the snapshots' summaries go, the
    chunks' versions (table properties) stay, so an append of a committed chunk (a resumed
    run) still adds nothing."""
    out = tmp_path / "out"
    table = table_at(out)
    files = [write_chunk(out, key(s), rows_of([f"{s}-0"])) for s in "ab"]
    for one in files:
        table.append([one], schema=FITTED, metadata={})
    other = table.loaded().refresh()
    other.maintenance.expire_snapshots().older_than(datetime.now() + timedelta(seconds=1)).commit()
    assert len(other.refresh().snapshots()) == 1
    table.refresh()
    table.append(files, schema=FITTED, metadata={})
    assert [i for i, _ in read_all(out, table)] == ["a-0", "b-0"]
    assert table.version_of(key("a")) == table.version_of(key("b")) == 1
    assert table.chunks() == {key("a"), key("b")} and not table.handed([key("a"), key("b")])


def test_a_table_with_no_file_takes_new_columns_in_order(tmp_path: Path):
    """After every chunk retired (a ``--restart``), files of other columns replace the
    table's, in their order (an append would keep the old and hide the new); while the table
    holds files, a column batchscore writes with another type is refused, naming it."""
    out = tmp_path / "out"
    table = table_at(out)
    table.append([write_chunk(out, key("a"), rows_of(["a-0"]))], schema=FITTED, metadata={})
    wider = rows_of(["a-0"]).add_column(1, "x0", pa.array([1.5]))
    retyped = rows_of(["a-1"]).set_column(1, "label", pa.array(["one"]))
    with pytest.raises(
        WriteError, match="column 'label' is int in the table, but batchscore writes string"
    ):
        table.append([write_chunk(out, key("b"), retyped)], schema=fit(retyped.schema), metadata={})
    assert table.version_of(key("b")) == 0
    table.retire([key("a")])
    table.append([write_chunk(out, key("c"), wider)], schema=fit(wider.schema), metadata={})
    assert [f.name for f in table.loaded().schema().fields] == ["id", "x0", "label", "scores"]
    assert duckdb_rows(str(out), "id, x0") == [("a-0", 1.5)]


def test_a_catalog_that_lost_the_table_registers_it_again(tmp_path: Path):
    """The SQLite catalog is only a pointer to the newest metadata file: deleted, the next
    start registers the table again from the folder, versions and rows as they were."""
    out = tmp_path / "out"
    table = table_at(out)
    files = [write_chunk(out, key("a"), rows_of(["a-0", "a-1"]))]
    table.append(files, schema=FITTED, metadata={})
    (out / CATALOG).unlink()

    again = table_at(out)
    again.append(files, schema=FITTED, metadata={})

    assert (out / CATALOG).is_file() and again.version_of(key("a")) == 1
    assert [i for i, _ in read_all(out, again)] == ["a-0", "a-1"]


def test_a_file_the_table_does_not_take_is_refused_naming_the_table(tmp_path: Path):
    """A chunk file whose columns the table cannot read (here: a missing required column,
    as pyiceberg's own check says) fails the commit with a `WriteError` naming the table,
    and the chunk's version stays even."""
    out = tmp_path / "out"
    table = table_at(out)
    table.append([write_chunk(out, key("a"), rows_of(["a-0"]))], schema=FITTED, metadata={})
    (out / part_name(key("b"))).write_bytes(b"not parquet")
    from batchscore.output.manifest import FileFacts

    with pytest.raises(WriteError, match=r"cannot commit to the Iceberg table"):
        table.append([(key("b"), FileFacts(11, 1, "", ""))], schema=FITTED, metadata={})
    assert table.version_of(key("b")) == 0 and table.chunks() == {key("a")}


def test_without_pyiceberg_the_error_names_the_extra(tmp_path: Path, monkeypatch):
    """The package is installed here, so its absence is simulated (an import that fails)."""
    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    with pytest.raises(JobError, match=r"pip install 'batchscore\[iceberg\]'"):
        Table(LocalStore(tmp_path), lineage={})


def test_the_table_schema_holds_only_iceberg_types():
    schema = pa.schema(
        [
            ("v", pa.list_(pa.float32(), 4)),
            ("q", pa.list_(pa.uint8(), 2)),
            ("n", pa.uint32()),
            ("s", pa.struct([("k", pa.uint16())])),
            ("t", pa.large_string()),
            ("h", pa.float16()),
            ("at", pa.timestamp("ns", "UTC")),
        ]
    )
    assert fit(schema) == pa.schema(
        [
            ("v", pa.list_(pa.float32())),
            ("q", pa.list_(pa.int32())),
            ("n", pa.int64()),
            ("s", pa.struct([("k", pa.int32())])),
            ("t", pa.string()),
            ("h", pa.float32()),
            ("at", pa.timestamp("us", "UTC")),
        ]
    )
    with pytest.raises(JobError, match="uint64"):
        fit(pa.schema([("big", pa.uint64())]))


def test_a_rest_catalog_holds_the_table(tmp_path: Path):
    """A REST catalog (the tests' own server on loopback, `tests.output.rest_catalog`:
    backed by a SQL catalog, it speaks the REST protocol pyiceberg's RestCatalog speaks): the
    table is created at the output's location and committed through it, idempotent as ever;
    pyiceberg reads it through the REST catalog, DuckDB and pyiceberg from the folder."""
    from pyiceberg.catalog.rest import RestCatalog

    from tests.output.rest_catalog import rest_catalog

    out = tmp_path / "out"
    with rest_catalog(tmp_path / "server") as uri:
        table = table_at(out, catalog={"type": "rest", "uri": uri}, identifier="team.scores")
        files = [write_chunk(out, key(s), rows_of([f"{s}-0", f"{s}-1"])) for s in "ab"]
        for _ in range(2):
            table.append(files, schema=FITTED, metadata={})
        table.retire([key("b")])

        assert not (out / CATALOG).exists()  # the job's catalog, not one of batchscore's own
        found = RestCatalog("team", uri=uri).load_table(("team", "scores"))
        assert found.location() == str(out) and found.metadata_location.startswith(str(out))
        assert sorted(found.scan().to_arrow()["id"].to_pylist()) == ["a-0", "a-1"]
        assert [i for i, _ in read_all(out, table)] == ["a-0", "a-1"]
        assert table.version_of(key("a")) == 1 and table.version_of(key("b")) == 2
