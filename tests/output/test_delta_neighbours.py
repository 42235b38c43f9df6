"""A Delta table is shared: other tools compact it (OPTIMIZE, Z-order), delete from it, vacuum
it, add columns to it and append rows of their own, with deltalake's real maintenance calls.
Their commits are the table's truth: batchscore's next runs, by shards and by rows (nothing
to do, then rows appended, edited and deleted and a shard removed), never add back a file
another writer took out, never double a row, never touch another writer's rows, and say what
they found; a column batchscore writes that another writer retyped or dropped is refused,
naming it, before anything changes.

The check is a reader's (`assert_holds`): deltalake, polars' ``read_delta`` and DuckDB's
``delta_scan`` agree, every current input row is in the table once by its id with the score
a clean run gives it (but a row another writer deleted, while its input row is unchanged),
and another writer's rows are intact. `tests.output.tiny.delta_rows` does not apply here:
after a compaction the table's files are no longer the committed chunks' files.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from duckdb_extensions import import_extension

from batchscore.errors import WriteError
from batchscore.job.parse import load_job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.delta import app_id
from batchscore.output.drift import SchemaDriftError
from batchscore.recipes.run import run_job
from batchscore.storage.layout import part_name
from tests.commands import invoke, run
from tests.output.neighbours import append_foreign, neighbour, table_rows
from tests.output.tiny import SCHEMA, rows_job, rows_table, tiny_job, write_rows

deltalake = pytest.importorskip("deltalake", reason="the Delta tests need deltalake (dev extra)")
pl = pytest.importorskip("polars")

BY = ["shards", "rows"]


def job_for(root: Path, by: str) -> Path:
    """The tiny tensor job writing a Delta table at ``root/out``, by shards or by rows."""
    if by == "rows":
        return rows_job(root, fmt="delta")
    job = tiny_job(root)
    job.write_text(job.read_text().replace("[output]\n", '[output]\nformat = "delta"\n', 1))
    return job


def first_run(root: Path, by: str) -> Path:
    """Shards a (10 rows) and b (6), their first run committed; returns the job file."""
    job = job_for(root, by)
    write_rows(root / "in/a.parquet", rows_table([f"a-{i}" for i in range(10)], seed=1))
    write_rows(root / "in/b.parquet", rows_table([f"b-{i}" for i in range(6)], seed=2))
    assert run_job(load_job(job))["outcome"] == "ok"
    return job


def change(inputs: Path) -> None:
    """The input's changes: a-1 edited and a-2 deleted (by shards, a changes whole), b
    removed, c appended."""
    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][1] += 1.0
    write_rows(inputs / "a.parquet", pa.table(a).cast(SCHEMA).take([0, 1, *range(3, 10)]))
    (inputs / "b.parquet").unlink()
    write_rows(inputs / "c.parquet", rows_table([f"c-{i}" for i in range(5)], seed=3))


def clean(root: Path, inputs: Path) -> dict[str, list[float]]:
    """Each row of ``inputs`` with its scores, from a clean run into a Parquet folder."""
    shutil.copytree(inputs, root / "in")
    job = tiny_job(root)
    assert run_job(load_job(job))["outcome"] == "ok"
    rows = pa.concat_tables(pq.read_table(p) for p in (root / "out").glob("*.parquet"))
    return dict(zip(rows["id"].to_pylist(), rows["scores"].to_pylist(), strict=True))


def assert_holds(
    out: Path, want: dict[str, list[float]], foreign: list[tuple[str, list[float]]] = ()
) -> None:
    """Every row of ``want`` once, with its scores; the ``foreign`` rows as they were; no
    other row."""
    found = table_rows(out)
    ids = [i for i, _ in found]
    assert len(ids) == len(set(ids)), f"rows twice: {sorted(i for i in ids if ids.count(i) > 1)}"
    got = dict(found)
    assert sorted(got) == sorted([*want, *(i for i, _ in foreign)])
    for i, scores in want.items():
        assert np.allclose(got[i], scores, atol=1e-5), i
    for i, scores in foreign:
        assert got[i] == scores, i


def chunk_files_on_disk(out: Path) -> set[str]:
    return {p.name for p in out.glob("part-*.parquet") if len(p.name) < 40}


@pytest.mark.parametrize("by", BY)
@pytest.mark.parametrize("operation", ["compact", "z_order", "vacuum"])
def test_maintenance_never_doubles_rows(tmp_path: Path, by: str, operation: str, caplog):
    """OPTIMIZE, Z-order, or compaction then vacuum (batchscore's own files deleted from
    disk): the next run has nothing to do and adds nothing back; it says once which commit
    took the files over; a run with input changes retires the old rows wherever the table
    now holds them and appends the new, each row once with the right score."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    foreign = append_foreign(out)
    neighbour(out, operation)
    if operation == "vacuum":
        assert not chunk_files_on_disk(out)  # batchscore's files are gone: no damage
    dt = deltalake.DeltaTable(str(out))
    version = dt.version()
    [optimized] = [h["version"] for h in dt.history() if h["operation"] == "OPTIMIZE"]

    with caplog.at_level(logging.WARNING, logger="batchscore"):
        report = run_job(load_job(job))

    assert report["rows"] == 0 and report["outcome"] == "ok"
    assert deltalake.DeltaTable(str(out)).version() == version  # nothing committed
    said = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
    assert len(said) == 1 and f"(OPTIMIZE at version {optimized})" in said[0], said
    assert "were replaced or removed by another writer" in said[0]
    want = clean(tmp_path / "clean", tmp_path / "job/in")
    assert_holds(out, want, foreign)
    status = invoke("status", str(job), "--json")
    assert status.exit_code == 0, status.output
    shown = json.loads(status.output)
    assert shown["complete"] and shown["taken_over"]["chunks"] == 5
    assert all(s["state"] == "done" for s in shown["shards"]), shown["shards"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        assert run_job(load_job(job))["rows"] == 0  # said once: not again
    assert not [r for r in caplog.records if "another writer" in r.getMessage()]

    change(tmp_path / "job/in")
    report = run_job(load_job(job))

    assert report["outcome"] == "ok" and (out / "_SUCCESS").is_file()
    assert_holds(out, clean(tmp_path / "clean2", tmp_path / "job/in"), foreign)
    assert run_job(load_job(job))["rows"] == 0
    assert_holds(out, clean(tmp_path / "clean3", tmp_path / "job/in"), foreign)


@pytest.mark.parametrize("by", BY)
def test_a_row_another_writer_deleted_stays_deleted(tmp_path: Path, by: str):
    """``dt.delete(predicate)``: the row is gone from the table and stays gone while its input
    row holds (the writer's commit is the table's truth); once the row changes (by shards:
    its shard changes), batchscore scores it again, once."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    deltalake.DeltaTable(str(out)).delete("id = 'a-3'")

    assert run_job(load_job(job))["rows"] == 0

    want = clean(tmp_path / "clean", tmp_path / "job/in")
    assert_holds(out, {i: s for i, s in want.items() if i != "a-3"})
    a = pq.read_table(tmp_path / "job/in/a.parquet").to_pydict()
    a["x1"][3] += 1.0
    write_rows(tmp_path / "job/in/a.parquet", a)
    run_job(load_job(job))
    assert_holds(out, clean(tmp_path / "clean2", tmp_path / "job/in"))


@pytest.mark.parametrize("by", BY)
def test_a_column_another_writer_added_is_kept(tmp_path: Path, by: str):
    """``alter.add_columns`` (nullable): batchscore's files lack the column, which is valid
    Delta (readers read nulls); every run goes on under the table's columns, nothing retired
    is refused, and the column stays."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    neighbour(out, "add_column")
    change(tmp_path / "job/in")

    report = run_job(load_job(job))

    assert report["outcome"] == "ok"
    assert_holds(out, clean(tmp_path / "clean", tmp_path / "job/in"))
    table = deltalake.DeltaTable(str(out)).to_pyarrow_table()
    assert "note" in table.column_names and table["note"].null_count == table.num_rows
    assert pl.read_delta(str(out))["note"].null_count() == table.num_rows
    con = duckdb.connect()
    import_extension("delta", con=con)
    con.execute("LOAD delta")
    nulls = f"select count(*) from delta_scan('{out}') where note is null"
    assert con.execute(nulls).fetchone() == (table.num_rows,)
    neighbour(out, "compact")
    a = pq.read_table(tmp_path / "job/in/a.parquet").to_pydict()
    a["x2"][0] -= 1.0
    write_rows(tmp_path / "job/in/a.parquet", a)
    assert run_job(load_job(job))["outcome"] == "ok"
    assert_holds(out, clean(tmp_path / "clean2", tmp_path / "job/in"))


@pytest.mark.parametrize("by", BY)
@pytest.mark.parametrize("how", ["retyped", "dropped"])
def test_a_column_retyped_or_dropped_is_refused_before_anything_changes(
    tmp_path: Path, by: str, how: str
):
    """Another writer overwrites the table with `scores` as text, or without it (deltalake
    drops or retypes a column only so): the next run refuses, exit 6, naming the column,
    before it retires or appends anything: the table and the folder's records are as the
    writer left them."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    rows = deltalake.DeltaTable(str(out)).to_pyarrow_table()
    at = rows.schema.get_field_index("scores")
    if how == "retyped":
        rows = rows.set_column(at, "scores", pa.array([str(s) for s in rows["scores"]]))
    else:
        rows = rows.remove_column(at)
    deltalake.write_deltalake(str(out), rows, mode="overwrite", schema_mode="overwrite")
    change(tmp_path / "job/in")
    version = deltalake.DeltaTable(str(out)).version()
    records = sorted(p.name for p in (out / "_batchscore/done").iterdir())

    result = run(job)

    assert result.returncode == WriteError.exit_code, result.stderr
    assert "'scores'" in result.stderr and "Traceback" not in result.stderr
    assert "no longer takes batchscore's files" in result.stderr
    assert deltalake.DeltaTable(str(out)).version() == version
    assert sorted(p.name for p in (out / "_batchscore/done").iterdir()) == records
    assert not list((out / "_batchscore/gone").glob("*.json"))
    status = invoke("status", str(job), "--check")
    # one verdict: status --check exits as the run does, with its message
    assert status.exit_code == WriteError.exit_code and "'scores'" in status.output


def test_a_shard_leaving_without_an_id_is_refused_before_anything_changes(tmp_path: Path):
    """Without `[input].id`, rows another writer mixed with its own cannot be told apart:
    a shard that leaves after a compaction is refused, exit 6, naming the shard and the
    writer's commit, and nothing changes."""
    job = job_for(tmp_path, "shards")
    job.write_text(job.read_text().replace('id = "id"\n', "", 1))
    write_rows(tmp_path / "in/a.parquet", rows_table([f"a-{i}" for i in range(10)], seed=1))
    write_rows(tmp_path / "in/b.parquet", rows_table([f"b-{i}" for i in range(6)], seed=2))
    run_job(load_job(job))
    out = tmp_path / "out"
    neighbour(out, "compact")
    version = deltalake.DeltaTable(str(out)).version()
    assert run_job(load_job(job))["rows"] == 0  # nothing leaves: fine
    (tmp_path / "in/b.parquet").unlink()

    result = run(job)

    assert result.returncode == WriteError.exit_code, result.stderr
    assert "b.parquet" in result.stderr and f"OPTIMIZE at version {version}" in result.stderr
    assert "no [input].id" in result.stderr and "changed nothing" in result.stderr
    assert deltalake.DeltaTable(str(out)).version() == version
    assert deltalake.DeltaTable(str(out)).to_pyarrow_table().num_rows == 16


def test_a_foreign_row_sharing_an_id_is_never_deleted_with_batchscore_rows(tmp_path: Path):
    """By shards a chunk's rows are found by their ids alone: where another writer's row
    holds an id of a shard that leaves (after a compaction took the shard's file over), a
    delete by id would take it too, so the run refuses, exit 6, naming the id, before
    anything changes."""
    job, out = first_run(tmp_path / "job", "shards"), tmp_path / "job/out"
    rows = deltalake.DeltaTable(str(out)).to_pyarrow_table(filters=[("id", "=", "b-1")])
    deltalake.write_deltalake(str(out), rows, mode="append")  # another writer's copy of b-1
    neighbour(out, "compact")
    assert run_job(load_job(job))["rows"] == 0
    (tmp_path / "job/in/b.parquet").unlink()
    version = deltalake.DeltaTable(str(out)).version()

    result = run(job)

    assert result.returncode == WriteError.exit_code, result.stderr
    assert "'b-1'" in result.stderr and "changed nothing" in result.stderr
    assert deltalake.DeltaTable(str(out)).version() == version
    assert deltalake.DeltaTable(str(out)).to_pyarrow_table().num_rows == 17


@pytest.mark.parametrize("by", BY)
def test_plan_after_vacuum_has_nothing_to_score(tmp_path: Path, by: str):
    """`plan` (a dry run) judges chunks another writer took over as `run` does: committed,
    their vacuumed files no damage."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    neighbour(out, "vacuum")

    planned = invoke("plan", str(job), "--json", "--no-timing")

    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["rows_to_score"] == 0


@pytest.mark.parametrize("by", BY)
def test_restart_after_compaction_takes_batchscore_rows_out_and_keeps_foreign(
    tmp_path: Path, by: str
):
    """``--restart`` after another writer compacted batchscore's rows (with its own) into
    its files: batchscore's rows leave by their keys, the writer's stay, each row once."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    foreign = append_foreign(out)
    neighbour(out, "vacuum")

    report = run_job(load_job(job), restart=True)

    assert report["rows"] == 16
    assert_holds(out, clean(tmp_path / "clean", tmp_path / "job/in"), foreign)
    assert not list((out / "_batchscore/keys").glob("*.arrow.*"))


@pytest.mark.slow
@pytest.mark.parametrize("by", BY)
@pytest.mark.parametrize(
    "point",
    ["retire-move@1", "remove@1", "after-rename@1", "after-table-commit@1", "after-record@1"],
)
def test_a_kill_after_a_neighbour_leaves_each_row_once(tmp_path: Path, by: str, point: str):
    """SIGKILL of a run with input changes, after another writer compacted and vacuumed the
    table: the next run leaves each current row once, another writer's rows intact."""
    job, out = first_run(tmp_path / "job", by), tmp_path / "job/out"
    foreign = append_foreign(out)
    neighbour(out, "vacuum")
    change(tmp_path / "job/in")

    killed = run(job, faults=f"{point}:kill")

    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ids = [i for i, _ in table_rows(out)]
    assert len(ids) == len(set(ids))  # never a row twice, even now
    assert run_job(load_job(job))["outcome"] == "ok"
    assert_holds(out, clean(tmp_path / "clean", tmp_path / "job/in"), foreign)
    assert run_job(load_job(job))["rows"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("by", BY)
def test_an_unrecorded_append_another_writer_compacted_is_taken_back(tmp_path: Path, by: str):
    """Killed after a chunk's Delta commit, before its record; then another writer compacts
    (and vacuums) the unrecorded file into its own: the next start takes those rows back out
    of the table by the chunk's keys and scores them again, once."""
    job = job_for(tmp_path, by)
    write_rows(tmp_path / "in/a.parquet", rows_table([f"a-{i}" for i in range(10)], seed=1))
    killed = run(job, faults="after-table-commit@2:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    out = tmp_path / "out"
    unrecorded = set(Checkpoint(out).intents())
    assert unrecorded and not unrecorded & set(Checkpoint(out).committed())
    neighbour(out, "vacuum")
    assert not any(part_name(k) in chunk_files_on_disk(out) for k in unrecorded)

    assert run_job(load_job(job))["outcome"] == "ok"

    assert_holds(out, clean(tmp_path / "clean", tmp_path / "in"))
    dt = deltalake.DeltaTable(str(out))
    for key in Checkpoint(out).committed():
        assert dt.transaction_version(app_id(key)) % 2 == 1


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["compact", "vacuum"])
@pytest.mark.parametrize("point", ["rewrite@1", "rewrite-table@1", "rewrite-record@1"])
def test_a_rewrite_cut_off_then_a_compaction_leaves_each_row_once(
    tmp_path: Path, point: str, operation: str
):
    """By rows, a run killed while it swaps a file that lost rows for its kept rows (the new
    file published, or swapped in, or recorded); then another writer compacts (and vacuums)
    the table, the old file or the new among what it takes over: the next start finishes or
    drops the swap, and each row is in the table once."""
    job, out = first_run(tmp_path / "job", "rows"), tmp_path / "job/out"
    foreign = append_foreign(out)
    change(tmp_path / "job/in")
    killed = run(job, faults=f"{point}:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    neighbour(out, operation)

    assert run_job(load_job(job))["outcome"] == "ok"

    assert_holds(out, clean(tmp_path / "clean", tmp_path / "job/in"), foreign)
    assert run_job(load_job(job))["rows"] == 0


def write_typed(inputs: Path, kind: pa.DataType) -> None:
    """Shards a (10 rows) and b (6) with ids of type ``kind`` (the same values)."""
    for name, seed, rows in (("a", 1, 10), ("b", 2, 6)):
        table = rows_table([str(i) for i in range(rows)], seed=seed)
        ids = pa.array(range(100 * seed, 100 * seed + rows)).cast(kind)
        pq.write_table(table.set_column(0, "id", ids), inputs / f"{name}.parquet")


@pytest.mark.parametrize("by", BY)
@pytest.mark.parametrize(("before", "after"), [("string", "long"), ("long", "string")])
@pytest.mark.parametrize("operation", ["compact", "vacuum"])
def test_an_id_whose_type_changed_is_refused_before_anything_retires(
    tmp_path: Path, by: str, before: str, after: str, operation: str
):
    """The input's ids change type (text to integers, or back): this run's files would not
    take in the table, so the run refuses, exit 5 (the folder's schema, as a folder of files
    refuses it), naming the column, before any old row retires (the issue: every row retired
    as edited, then its new score refused), whether the table's committed files are there to
    tell the folder's type or another writer's vacuum took them."""
    kinds = {"string": pa.string(), "long": pa.int64()}
    job, out = job_for(tmp_path, by), tmp_path / "out"
    write_typed(tmp_path / "in", kinds[before])
    assert run_job(load_job(job))["outcome"] == "ok"
    neighbour(out, operation)
    write_typed(tmp_path / "in", kinds[after])
    version = deltalake.DeltaTable(str(out)).version()
    records = sorted(p.name for p in (out / "_batchscore/done").iterdir())

    result = run(job)

    assert result.returncode == SchemaDriftError.exit_code, result.stderr
    assert "column 'id' is" in result.stderr, result.stderr
    assert "nothing was scored or retired" in result.stderr or "changed nothing" in result.stderr
    assert deltalake.DeltaTable(str(out)).version() == version
    assert sorted(p.name for p in (out / "_batchscore/done").iterdir()) == records
    assert deltalake.DeltaTable(str(out)).to_pyarrow_table().num_rows == 16
