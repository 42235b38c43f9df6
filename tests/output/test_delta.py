"""``[output].format = "delta"``: the output folder is a Delta Lake table that deltalake, polars
and DuckDB read as it is, each commit idempotent through the chunks' application transactions,
so a run killed anywhere and resumed has every current input row in the table exactly once;
shards that leave the input leave the table as Delta deletes; every commit names its lineage."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from duckdb_extensions import import_extension

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.delta import Table, app_id, fit
from batchscore.output.manifest import facts_of
from batchscore.recipes.run import run_job
from batchscore.storage.disk import LocalStore
from batchscore.storage.layout import chunk_key, is_chunk_name, part_name, shard_key, successor_key
from batchscore.version import __version__
from tests.commands import invoke, run
from tests.conftest import read_output
from tests.output.tiny import rows_job, tiny_job, write_shard

deltalake = pytest.importorskip("deltalake", reason="the Delta tests need deltalake (dev extra)")


def delta_job(root: Path, chunk_rows: int = 4) -> Path:
    """The tiny tensor job (`tests.output.tiny`), writing a Delta table at ``root/out``."""
    job = tiny_job(root, chunk_rows=chunk_rows)
    job.write_text(job.read_text().replace("[output]\n", '[output]\nformat = "delta"\n', 1))
    return job


def table_ids(out: Path) -> list[str]:
    return deltalake.DeltaTable(str(out)).to_pyarrow_table(columns=["id"])["id"].to_pylist()


def assert_consistent(out: Path, want: list[str]) -> None:
    """The table holds each of ``want`` once; its files are exactly the committed chunks'
    files, and each committed chunk's application transaction says it is in the table."""
    assert sorted(table_ids(out)) == sorted(want)
    dt = deltalake.DeltaTable(str(out))
    committed = Checkpoint(out).committed()
    live = {Path(uri).name for uri in dt.file_uris()}
    assert live == {part_name(key) for key in committed}
    assert all(dt.transaction_version(app_id(key)) % 2 == 1 for key in committed)


def test_delta_output_is_read_as_it_is_by_deltalake_polars_and_duckdb(tmp_path: Path):
    """The same rows and scores as the Parquet folder, through three readers; each commit's
    info names the job, the model, the precision and batchscore's version."""
    job = delta_job(tmp_path / "delta")
    a = write_shard(tmp_path / "delta/in/a.parquet", 10)
    b = write_shard(tmp_path / "delta/in/b.parquet", 5, seed=1)
    report = run_job(load_job(job))
    assert report["rows"] == 15 and report["outcome"] == "ok"
    out = tmp_path / "delta/out"
    assert (out / "_delta_log").is_dir() and (out / "_SUCCESS").is_file()
    plain = tiny_job(tmp_path / "plain")
    write_shard(tmp_path / "plain/in/a.parquet", 10)
    write_shard(tmp_path / "plain/in/b.parquet", 5, seed=1)
    run_job(load_job(plain))
    want = read_output(tmp_path / "plain/out").sort_by("id")

    dt = deltalake.DeltaTable(str(out))
    got = dt.to_pyarrow_table().sort_by("id")
    assert got["id"].to_pylist() == sorted(a + b) == want["id"].to_pylist()
    assert got["prediction"].to_pylist() == want["prediction"].to_pylist()
    assert got["scores"].to_pylist() == want["scores"].to_pylist()
    frame = pl.read_delta(str(out)).sort("id")
    assert frame["id"].to_list() == sorted(a + b)
    assert frame["scores"].to_list() == want["scores"].to_pylist()
    con = duckdb.connect()  # DuckDB scans the table's current files through Arrow
    con.register("scores", dt.to_pyarrow_dataset())
    rows = con.execute("select id, prediction from scores order by id").fetchall()
    assert rows == list(zip(want["id"].to_pylist(), want["prediction"].to_pylist(), strict=True))

    appends = [h for h in dt.history() if h.get("batchscore.operation") == "append"]
    assert sum(len(h["batchscore.chunks"]) for h in appends) == report["chunks_committed"] == 5
    for commit in appends:
        assert commit["batchscore.job"] == "job"
        assert commit["batchscore.model"].endswith("mlp.safetensors")
        assert commit["batchscore.precision"] == "fp32"
        assert commit["batchscore.version"] == __version__
    assert_consistent(out, a + b)
    again = run_job(load_job(job))  # nothing to do: no new version
    assert again["rows"] == 0 and deltalake.DeltaTable(str(out)).version() == dt.version()


def test_duckdb_delta_scan_reads_the_table(tmp_path: Path):
    """DuckDB's own Delta reader reads the table as is. Its extension comes from the
    duckdb-extension-delta wheel (the dev extra): DuckDB alone downloads it on first use."""
    job = delta_job(tmp_path)
    ids = write_shard(tmp_path / "in/a.parquet", 6)
    run_job(load_job(job))
    con = duckdb.connect()
    import_extension("delta", con=con)
    con.execute("LOAD delta")
    got = con.execute(f"select id from delta_scan('{tmp_path / 'out'}') order by id").fetchall()
    assert [i for (i,) in got] == sorted(ids)


def test_a_shard_that_leaves_the_input_is_a_delta_delete(tmp_path: Path):
    """A renamed shard's chunks leave the table in one transaction (its files kept under
    gone/ as for Parquet); a changed shard's chunks leave it before their files are replaced."""
    job = delta_job(tmp_path)
    a = write_shard(tmp_path / "in/a.parquet", 10)
    write_shard(tmp_path / "in/b.parquet", 5, seed=1)
    run_job(load_job(job))
    out = tmp_path / "out"
    before = deltalake.DeltaTable(str(out)).version()
    (tmp_path / "in/b.parquet").rename(tmp_path / "in/c.parquet")
    c = write_shard(tmp_path / "in/c.parquet", 3, seed=2)  # renamed, and changed
    a = write_shard(tmp_path / "in/a.parquet", 9, seed=3)  # changed in place: rescored
    report = run_job(load_job(job))
    assert [g["rows_written"] for g in report["gone_shards"]] == [5]
    assert_consistent(out, a + c)
    dt = deltalake.DeltaTable(str(out))
    deletes = [h for h in dt.history() if h.get("batchscore.operation") == "delete"]
    # b's chunks in one transaction (its retirement), then each un-committed chunk of a
    assert [len(h["batchscore.chunks"]) for h in reversed(deletes)] == [2, 1, 1, 1]
    assert deletes[0]["batchscore.job"] == "job" and dt.version() > before


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    ["after-rename@2", "after-table-commit@2", "after-table-commit@4", "after-record@3"],
)
def test_a_kill_anywhere_in_a_commit_never_appends_twice(tmp_path: Path, fault: str):
    """SIGKILL between publishing a group's files, its Delta transaction and its commit
    records: the next run takes the unrecorded files out of the table (their application
    transactions say they are in) before replacing them, so each row is in the table once."""
    job = delta_job(tmp_path)
    ids = write_shard(tmp_path / "in/a.parquet", 10) + write_shard(tmp_path / "in/b.parquet", 5)
    killed = run(job, faults=f"{fault}:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "out"
    if "table-commit" in fault:  # the kill left files in the table that no record names
        dt = deltalake.DeltaTable(str(out))
        assert len(dt.file_uris()) > len(Checkpoint(out).committed())
    report = run_job(load_job(job))
    assert report["outcome"] == "ok"
    assert_consistent(out, ids)


@pytest.mark.slow
def test_a_kill_during_a_retirement_is_finished_by_the_next_start(tmp_path: Path):
    """Killed after the retired shard left the table, while its files move to gone/: the
    next start finishes the moves, and the table never held the shard twice."""
    job = delta_job(tmp_path)
    a = write_shard(tmp_path / "in/a.parquet", 10)
    b = write_shard(tmp_path / "in/b.parquet", 5, seed=1)  # its ids stay "b-<i>" when renamed
    run_job(load_job(job))
    (tmp_path / "in/b.parquet").rename(tmp_path / "in/c.parquet")
    killed = run(job, faults="retire-move@1:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(table_ids(tmp_path / "out")) == sorted(a)  # b out of the table already
    report = run_job(load_job(job))
    assert [g["rows_written"] for g in report["gone_shards"]] == [5] and report["rows"] == 5
    assert_consistent(tmp_path / "out", a + b)


@pytest.mark.slow
def test_an_unrecorded_file_leaves_the_table_before_it_is_deleted(tmp_path: Path):
    """Killed after a Delta commit, before its records; then the shard leaves the input, so
    the next run deletes the unrecorded file instead of replacing it: the table must not
    name a file that is gone (a reader would fail on it)."""
    job = delta_job(tmp_path)
    write_shard(tmp_path / "in/a.parquet", 10)
    b = write_shard(tmp_path / "in/b.parquet", 5, seed=1)
    killed = run(job, faults="after-table-commit@2:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (tmp_path / "in/a.parquet").unlink()
    run_job(load_job(job))
    assert_consistent(tmp_path / "out", b)


def test_adding_or_removing_a_chunk_twice_commits_once(tmp_path: Path):
    """The application transactions make `append` and `retire` idempotent: a second call
    with the same chunks (a retry after a lost answer, a resumed step) changes nothing."""
    out = tmp_path / "out"
    out.mkdir()
    key = chunk_key(shard_key("a"), 0)
    rows = pa.table({"id": ["a-0", "a-1"], "score": pa.array([0.5, 0.25], pa.float32())})
    pq.write_table(rows, out / part_name(key))
    table = Table(LocalStore(out), lineage={"batchscore.job": "unit"})
    files = [(key, facts_of(out / part_name(key)))]
    for _ in range(2):
        table.append(files, schema=rows.schema, metadata={})
    dt = deltalake.DeltaTable(str(out))
    assert dt.to_pyarrow_table()["id"].to_pylist() == ["a-0", "a-1"]
    assert dt.transaction_version(app_id(key)) == 1 and dt.version() == 1  # create, one append
    assert table.retire([key]) == 1 and table.retire([key]) == 0
    dt = deltalake.DeltaTable(str(out))
    assert dt.to_pyarrow_table().num_rows == 0 and dt.transaction_version(app_id(key)) == 2
    table.append(files, schema=rows.schema, metadata={})  # back in: a new version, odd again
    dt = deltalake.DeltaTable(str(out))
    assert dt.to_pyarrow_table().num_rows == 2 and dt.transaction_version(app_id(key)) == 3
    assert dt.history()[0]["batchscore.job"] == "unit"


def test_swapping_a_rewritten_file_commits_once(tmp_path: Path):
    """`Table.rewrite` (by rows, a file less its retired rows, under a new chunk key): one
    transaction removes the old file and adds the new, both chunks' versions moved on, with
    the lineage; a second call (a resumed step) changes nothing."""
    out = tmp_path / "out"
    out.mkdir()
    old, new = chunk_key(shard_key("a"), 0), successor_key(chunk_key(shard_key("a"), 0), "r")
    pq.write_table(pa.table({"id": ["a-0", "a-1", "a-2"]}), out / part_name(old))
    pq.write_table(pa.table({"id": ["a-0", "a-2"]}), out / part_name(new))
    table = Table(LocalStore(out), lineage={"batchscore.job": "unit"})
    table.append(
        [(old, facts_of(out / part_name(old)))],
        schema=pa.schema([("id", pa.string())]),
        metadata={},
    )
    facts = facts_of(out / part_name(new))
    for _ in range(2):
        table.rewrite(old, new, size=facts.size, rows=facts.rows)
    dt = deltalake.DeltaTable(str(out))
    assert dt.to_pyarrow_table()["id"].to_pylist() == ["a-0", "a-2"] and dt.version() == 2
    assert dt.transaction_version(app_id(old)) == 2 and dt.transaction_version(app_id(new)) == 1
    swap = dt.history()[0]
    assert swap["batchscore.operation"] == "rewrite" and swap["batchscore.job"] == "unit"
    assert swap["batchscore.chunks"] == [new] and swap["batchscore.replaces"] == [old]
    assert new != old and is_chunk_name(part_name(new))


@pytest.mark.parametrize("by", ["shards", "rows"])
def test_the_start_mends_a_table_whose_files_left_the_records(tmp_path: Path, by: str):
    """A committed chunk whose file the table lost is added back, and a chunk file the table
    holds with no record leaves it (the file itself, no record's, is left where it is), in
    one transaction at the next start, by shards and by rows."""
    job = delta_job(tmp_path) if by == "shards" else rows_job(tmp_path, fmt="delta")
    ids = write_shard(tmp_path / "in/a.parquet", 10)
    run_job(load_job(job))
    out = tmp_path / "out"
    table = Table(LocalStore(out), lineage={})
    lost = min(Checkpoint(out).committed())
    assert table.retire([lost]) == 1
    stray = chunk_key(shard_key("not recorded"), 0)
    pq.write_table(pq.read_table(out / part_name(lost)), out / part_name(stray))
    schema = deltalake.DeltaTable(str(out)).schema().to_arrow()
    table.append([(stray, facts_of(out / part_name(stray)))], schema=pa.schema(schema), metadata={})

    report = run_job(load_job(job))

    assert report["rows"] == 0
    assert_consistent(out, ids)
    dt = deltalake.DeltaTable(str(out))
    [mend] = [h for h in dt.history() if h.get("batchscore.operation") == "reconcile"]
    assert mend["batchscore.chunks"] == [lost] and mend["batchscore.removed"] == [stray]
    assert dt.transaction_version(app_id(lost)) == 3 and dt.transaction_version(app_id(stray)) == 2
    assert (out / part_name(stray)).is_file()


def test_a_table_whose_log_was_deleted_is_made_again_from_the_records(tmp_path: Path):
    """The records are the commit point: a table whose ``_delta_log`` a hand deleted is made
    again at the next start, of every committed file, before the run's own appends."""
    job = delta_job(tmp_path)
    a = write_shard(tmp_path / "in/a.parquet", 6)
    run_job(load_job(job))
    shutil.rmtree(tmp_path / "out/_delta_log")
    b = write_shard(tmp_path / "in/b.parquet", 3, seed=1)
    assert run_job(load_job(job))["rows"] == 3
    assert_consistent(tmp_path / "out", a + b)


def test_restart_empties_the_table_and_takes_the_new_columns(tmp_path: Path):
    """A ``--restart`` takes every chunk out of the table before it removes the files; with
    columns changed, the empty table takes the new ones (an append would keep the old)."""
    job = delta_job(tmp_path)
    ids = write_shard(tmp_path / "in/a.parquet", 6)
    run_job(load_job(job))
    report = run_job(load_job(job), restart=True)
    assert report["rows"] == 6
    assert_consistent(tmp_path / "out", ids)
    job.write_text(job.read_text().replace('id = "id"\n', 'id = "id"\nkeep = ["x0"]\n', 1))
    run_job(load_job(job), restart=True)
    assert_consistent(tmp_path / "out", ids)
    table = deltalake.DeltaTable(str(tmp_path / "out")).to_pyarrow_table()
    assert table.column_names == ["id", "x0", "prediction", "scores"]
    assert table["x0"].null_count == 0


def test_without_deltalake_the_error_names_the_extra(tmp_path: Path, monkeypatch):
    """The package is installed here, so its absence is simulated (an import that fails)."""
    job = delta_job(tmp_path)
    write_shard(tmp_path / "in/a.parquet", 2)
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(JobError, match=r"batchscore\[delta\]"):
        run_job(load_job(job))
    result = invoke("run", str(job))
    assert result.exit_code == 2 and "pip install 'batchscore[delta]'" in result.output
    assert not (tmp_path / "out/_batchscore/done").exists()


def test_the_table_schema_has_no_fixed_size_lists_nor_unsigned_integers():
    schema = pa.schema(
        [
            ("v", pa.list_(pa.float32(), 4)),
            ("q", pa.list_(pa.uint8(), 2)),
            ("n", pa.uint32()),
            ("s", pa.struct([("k", pa.uint16())])),
            ("t", pa.string()),
        ]
    )
    assert fit(schema) == pa.schema(
        [
            ("v", pa.list_(pa.float32())),
            ("q", pa.list_(pa.int16())),
            ("n", pa.int64()),
            ("s", pa.struct([("k", pa.int32())])),
            ("t", pa.string()),
        ]
    )
    with pytest.raises(JobError, match="uint64"):
        fit(pa.schema([("big", pa.uint64())]))
