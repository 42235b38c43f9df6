"""An Iceberg table is shared: other writers compact it (here pyiceberg's ``overwrite`` of the
whole table with its own rows: every file rewritten into files of its own), delete from it
(pyiceberg's copy-on-write ``delete``), expire its snapshots and add columns to it, each with
pyiceberg's own calls through the table's catalog. Their commits are the table's truth:
`Table.handed` reports the chunks they took over, an append of those adds nothing, their
retirement takes batchscore's rows out by the chunks' keys wherever they now lie, and another
writer's own rows (and a row it deleted) stay as it left them. Every check is a reader's:
pyiceberg, polars and DuckDB agree (`tests.output.iceberg_tables.read_all`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from batchscore.errors import WriteError
from batchscore.job.sections import ROW_HASH
from batchscore.storage.layout import part_name

pyiceberg = pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg (dev extra)")

from pyiceberg.types import StringType  # noqa: E402

from batchscore.output.iceberg import Table  # noqa: E402
from batchscore.output.iceberg_columns import fit  # noqa: E402
from batchscore.output.keys import keys_of, publish_keys  # noqa: E402
from batchscore.storage.disk import LocalStore  # noqa: E402
from tests.output.iceberg_tables import (  # noqa: E402
    FITTED,
    key,
    read_all,
    rows_of,
    table_at,
    write_chunk,
)

A, B = [f"a-{i}" for i in range(4)], ["b-0", "b-1", "b-2"]


@pytest.fixture(autouse=True)
def quiet_polars(monkeypatch):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")


def committed(out: Path) -> Table:
    """Chunks a (4 rows) and b (3) in the table, in two snapshots."""
    table = table_at(out)
    table.append([write_chunk(out, key("a"), rows_of(A))], schema=FITTED, metadata={})
    table.append([write_chunk(out, key("b"), rows_of(B, seed=5))], schema=FITTED, metadata={})
    return table


def other(table: Table):
    """The table as another writer opens it: through the same catalog, its own handle."""
    return table.catalog.load_table(table.identifier)


def append_foreign(table: Table, ids: list[str]) -> list[str]:
    """Another writer appends rows of its own (pyiceberg writes their files)."""
    mine = other(table)
    mine.append(rows_of(ids, seed=9).cast(mine.schema().as_arrow()))
    return ids


def compact(table: Table) -> None:
    """Another writer rewrites every file of the table into its own (a compaction)."""
    mine = other(table)
    mine.overwrite(mine.scan().to_arrow())


def ids(out: Path, table: Table) -> list[str]:
    table.refresh()
    return [i for i, _ in read_all(out, table)]


@pytest.mark.parametrize("expire", [False, True])
def test_a_compaction_takes_the_chunks_over_and_nothing_doubles(tmp_path: Path, expire: bool):
    """After another writer compacted the table (then, perhaps, expired every older
    snapshot), both chunks are handed: an append of them adds nothing back, and retiring one
    takes its rows out of the writer's files by its keys, the writer's own rows kept."""
    out = tmp_path / "out"
    table = committed(out)
    foreign = append_foreign(table, ["f-0", "f-1"])
    compact(table)
    if expire:
        now = datetime.now() + timedelta(seconds=1)
        other(table).maintenance.expire_snapshots().older_than(now).commit()
    table.refresh()

    assert table.chunks() == set() and table.handed([key("a"), key("b")]) == {key("a"), key("b")}
    said = table.whose(
        {part_name(key("a")), part_name(key("b"))}
    )  # pyiceberg's overwrite: a delete, an append
    if expire:  # the delete snapshot is gone, the append kept
        assert said == "2 in a snapshot no longer kept"
    else:
        [gone] = [s for s in other(table).snapshots() if s.summary.operation.value == "delete"]
        assert said == f"delete at snapshot {gone.snapshot_id}"
    snapshots = len(other(table).snapshots())
    table.append(
        [write_chunk(out, key("a"), rows_of(A)), write_chunk(out, key("b"), rows_of(B, seed=5))],
        schema=FITTED,
        metadata={},
    )
    assert len(other(table).snapshots()) == snapshots  # nothing committed
    assert ids(out, table) == sorted(A + B + foreign)

    assert table.retire([key("b")]) == 1

    assert ids(out, table) == sorted(A + foreign)
    assert table.version_of(key("b")) == 2 and table.handed([key("a")]) == {key("a")}
    assert not (out / "_batchscore/keys" / f"{key('b')}.arrow").exists()
    assert table.retire([key("b")]) == 0 and ids(out, table) == sorted(A + foreign)


def test_a_row_another_writer_deleted_stays_deleted(tmp_path: Path):
    """pyiceberg's ``delete`` rewrites chunk a's file without a-1: the chunk is handed, a-1
    stays out (an append adds nothing back), and the chunk's retirement takes the rest of its
    rows out, b untouched."""
    out = tmp_path / "out"
    table = committed(out)
    other(table).delete("id == 'a-1'")
    table.refresh()

    assert table.handed([key("a"), key("b")]) == {key("a")} and table.chunks() == {key("b")}
    table.append([write_chunk(out, key("a"), rows_of(A))], schema=FITTED, metadata={})
    assert ids(out, table) == sorted([*A[:1], *A[2:], *B])
    table.retire([key("a")])
    assert ids(out, table) == sorted(B)


def test_rows_by_their_hash_leave_and_a_foreign_row_sharing_an_id_stays(tmp_path: Path):
    """By rows a chunk's keys are the id and the row hash: an exact match of both takes only
    batchscore's row, where another writer's row shares its id (its hash null)."""
    out = tmp_path / "out"
    table = table_at(out)
    rows = rows_of(A).append_column(ROW_HASH, pa.array([11, 12, 13, 14], pa.int64()))
    table.append([write_chunk(out, key("a"), rows)], schema=fit(rows.schema), metadata={})
    mine = other(table)
    copy = rows.slice(1, 1).set_column(3, ROW_HASH, pa.nulls(1, pa.int64()))
    mine.append(copy.cast(mine.schema().as_arrow()))
    compact(table)
    table.refresh()
    leaving = keys_of(rows.cast(fit(rows.schema)), "id").slice(1, 2)  # a-1 and a-2

    table.delete_rows({key("a"): leaving})

    assert ids(out, table) == ["a-0", "a-1", "a-3"]  # the a-1 left is the other writer's
    hashes = other(table).scan(selected_fields=("id", ROW_HASH)).to_arrow().sort_by("id")
    assert hashes[ROW_HASH].to_pylist() == [11, None, 14]
    assert table.handed([key("a")]) == {key("a")}  # some rows left; the chunk stays


def test_a_column_another_writer_added_is_kept(tmp_path: Path):
    """``update_schema().add_column`` (nullable): batchscore's files lack it, readers read
    nulls in their rows (by the name mapping, which pyiceberg updates), and appends go on
    under the table's columns, the column kept."""
    out = tmp_path / "out"
    table = committed(out)
    with other(table).update_schema() as update:
        update.add_column("note", StringType())
    table.refresh()

    table.append([write_chunk(out, key("c"), rows_of(["c-0"]))], schema=FITTED, metadata={})

    assert ids(out, table) == sorted([*A, *B, "c-0"])
    notes = other(table).scan().to_arrow()
    assert "note" in notes.column_names and notes["note"].null_count == notes.num_rows
    compact(table)
    table.refresh()
    table.retire([key("a")])
    assert ids(out, table) == sorted([*B, "c-0"])
    assert "note" in other(table).schema().column_names


@pytest.mark.parametrize("how", ["retyped", "dropped"])
def test_a_column_retyped_or_dropped_is_refused_before_anything_changes(tmp_path: Path, how):
    """Another writer drops ``scores`` (or drops it and adds it back as text): the next
    append is refused, naming the column, and the table is as the writer left it."""
    out = tmp_path / "out"
    table = committed(out)
    with other(table).update_schema(allow_incompatible_changes=True) as update:
        update.delete_column("scores")
    if how == "retyped":
        with other(table).update_schema() as update:
            update.add_column("scores", StringType())
    table.refresh()
    snapshots = len(other(table).snapshots())

    with pytest.raises(WriteError, match="'scores'") as refused:
        table.append([write_chunk(out, key("c"), rows_of(["c-0"]))], schema=FITTED, metadata={})
    with pytest.raises(WriteError, match="'scores'"):
        table.check_takes(FITTED)

    assert "no longer takes batchscore's files" in str(refused.value)
    assert len(other(table).snapshots()) == snapshots and table.version_of(key("c")) == 0


def test_a_chunk_without_keys_is_refused_naming_it(tmp_path: Path):
    """A taken-over chunk with no keys (a job without an id) cannot be found among the
    writer's rows: its retirement is refused, naming it, and nothing changes."""
    out = tmp_path / "out"
    table = committed(out)
    LocalStore(out).delete(f"_batchscore/keys/{key('a')}.arrow")
    compact(table)
    table.refresh()
    with pytest.raises(WriteError, match=key("a")):
        table.retire([key("a")])
    assert ids(out, table) == sorted(A + B)


def test_mend_adds_a_lost_chunk_and_removes_a_stray_one_in_one_snapshot(tmp_path: Path):
    """`Table.mend` (the start's reconciliation): a committed chunk the table lacks joins it,
    and a chunk file no record names leaves it, in one snapshot."""
    out = tmp_path / "out"
    table = committed(out)
    table.retire([key("a")])
    publish_keys(LocalStore(out), key("a"), keys_of(rows_of(A).cast(FITTED), "id"))
    before = len(other(table).snapshots())

    table.mend({}, stray=[key("b")], missing={key("a")})  # Iceberg reads the files' facts

    assert ids(out, table) == sorted(A) and len(other(table).snapshots()) == before + 1
    assert table.version_of(key("a")) == 3 and table.version_of(key("b")) == 2
