"""Row increments (`[input].increments = "rows"`): a row is its id and the hash of what is
scored, so each change to the input scores exactly the rows that changed, wherever they now
lie: rows appended, edited or deleted, files renamed, split, merged or compacted. Each test
counts the rows scored and retired from the run report, and checks the data glob against the
input, each current row once, nothing retired left in it; in every output format
(`tests.output.formats.FORMATS`), and in a table also the table, as each of its readers reads
it (deltalake, pyiceberg, polars, DuckDB): the same rows as the folder's committed files."""

from __future__ import annotations

import datetime
import decimal
import json
import os
from pathlib import Path
from typing import Any

import deltalake
import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from batchscore.job.parse import load_job
from batchscore.output import diff
from batchscore.output.delta import storage_options
from batchscore.output.iceberg_catalog import file_io
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from batchscore.storage.fs import filesystem
from tests.commands import invoke
from tests.output.formats import FORMATS, iceberg_table, table_format, table_rows
from tests.output.tiny import (
    SCHEMA,
    committed_rows,
    rows_job,
    rows_table,
    tiny_job,
    write_rows,
)


def glob_ids(out: Path) -> list[str]:
    """The ids the data glob holds, sorted (an id held twice, twice)."""
    return sorted(i for p in out.rglob("*.parquet") for i in pq.read_table(p)["id"].to_pylist())


def input_rows(folder: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob("*.parquet")))


def check(out: Path, inputs: Path) -> None:
    """The data glob holds each current input row once, its prediction that of its values."""
    rows = input_rows(inputs)
    glob = pa.concat_tables(pq.read_table(p) for p in out.rglob("*.parquet"))
    assert sorted(glob["id"].to_pylist()) == sorted(rows["id"].to_pylist())
    assert len(set(glob["id"].to_pylist())) == glob.num_rows
    assert (out / "_SUCCESS").is_file()
    if table_format(out):  # the table: the committed rows, the input's, once
        table = table_rows(out)
        assert table == committed_rows(out)
        assert sorted(i for i, _ in table) == sorted(rows["id"].to_pylist())


def scored(job: Path) -> tuple[int, int]:
    """A run's rows scored and rows retired, from its report (the environment passed in as
    the front doors pass it: an object store's AWS variables reach an Iceberg table)."""
    report = run_job(load_job(job), environ=os.environ)
    assert report["outcome"] == "ok"
    return report["rows"], report["rows_retired"]


@pytest.fixture(params=FORMATS)
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path, Path]:
    """A job by rows over ``in/a.parquet`` (10 rows) and ``in/b.parquet`` (6), all scored,
    in each output format."""
    job = rows_job(tmp_path, fmt=request.param)
    inputs = tmp_path / "in"
    write_rows(inputs / "a.parquet", rows_table([f"a{i}" for i in range(10)]))
    write_rows(inputs / "b.parquet", rows_table([f"b{i}" for i in range(6)], seed=1))
    assert scored(job) == (16, 0)
    assert scored(job) == (0, 0)  # nothing changed: nothing scored, nothing retired
    return job, inputs, tmp_path / "out"


def test_appended_rows_alone_are_scored(setup):
    job, inputs, out = setup
    a = pq.read_table(inputs / "a.parquet")
    write_rows(
        inputs / "a.parquet", pa.concat_tables([a, rows_table(["a10", "a11", "a12"], seed=2)])
    )
    assert scored(job) == (3, 0)
    check(out, inputs)


def test_an_edited_row_is_scored_again_and_its_old_score_retired(setup):
    job, inputs, out = setup
    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][4] += 1.0
    a["x2"][7] = -a["x2"][7]
    write_rows(inputs / "a.parquet", a)
    assert scored(job) == (2, 2)
    check(out, inputs)
    glob = pa.concat_tables(pq.read_table(p) for p in out.rglob("*.parquet"))
    fresh = glob.filter(pa.compute.equal(glob["id"], "a4"))
    assert fresh["_row_hash"].num_chunks and fresh.num_rows == 1
    if (out / "_delta_log").is_dir():  # each file that lost a row: one rewrite, with lineage
        history = deltalake.DeltaTable(str(out)).history()
        rewrites = [h for h in history if h.get("batchscore.operation") == "rewrite"]
        assert len(rewrites) == 1  # a4 and a7 lie in one chunk (rows 4-7)
        for commit in rewrites:
            assert commit["batchscore.job"] == "job" and commit["batchscore.precision"] == "fp32"
            [old], [new] = commit["batchscore.replaces"], commit["batchscore.chunks"]
            assert old != new and not (out / f"part-{old}.parquet").exists()
            assert (out / f"part-{new}.parquet").is_file()
    if table_format(out) == "iceberg":  # the same, in the rewrite's snapshot summary
        snapshots = iceberg_table(out).snapshots()
        summaries = [s.summary.additional_properties for s in snapshots]
        [commit] = [s for s in summaries if s.get("batchscore.operation") == "rewrite"]
        assert commit["batchscore.job"] == "job" and commit["batchscore.precision"] == "fp32"
        [old], [new] = (
            json.loads(commit["batchscore.replaces"]),
            json.loads(commit["batchscore.chunks"]),
        )
        assert old != new and not (out / f"part-{old}.parquet").exists()
        assert (out / f"part-{new}.parquet").is_file()


def test_rows_picked_from_a_range_are_not_counted_as_filtered(tmp_path: Path):
    """Edited rows 1 and 6 of one shard are scored as a chunk that picks them from rows 1-6:
    the four between are committed already, not dropped by `where` (the report said "4 input
    rows dropped by [input].where" of a job with no `where`). With a `where`, what it drops
    in a shard scored whole is still counted."""
    job = rows_job(tmp_path, where="x3 > -100.0")
    inputs = tmp_path / "in"
    write_rows(inputs / "a.parquet", rows_table([f"a{i}" for i in range(10)]))
    run_job(load_job(job))
    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][1] += 1.0
    a["x0"][6] += 1.0
    write_rows(inputs / "a.parquet", a)
    planned = invoke("plan", str(job), "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["filtered"] == 0
    report = run_job(load_job(job))
    assert (report["rows"], report["rows_retired"], report["filtered"]) == (2, 2, 0)
    b = rows_table([f"b{i}" for i in range(6)], seed=1).to_pydict()
    b["x3"][2] = -1000.0  # dropped by `where`
    write_rows(inputs / "b.parquet", b)
    report = run_job(load_job(job))
    assert (report["rows"], report["filtered"]) == (5, 1)


def test_deleted_rows_are_retired_and_kept(setup):
    job, inputs, out = setup
    a = pq.read_table(inputs / "a.parquet")
    write_rows(inputs / "a.parquet", a.take([0, 1, 2, 5, 9]))  # 5 of 10 deleted
    (inputs / "b.parquet").unlink()  # a whole file deleted
    assert scored(job) == (0, 11)
    check(out, inputs)
    kept = list((out / "_batchscore/gone").rglob("*.parquet.gone"))
    ids = {i for p in kept for i in pq.read_table(p, columns=["id"])["id"].to_pylist()}
    assert ids == {f"a{i}" for i in (3, 4, 6, 7, 8)} | {f"b{i}" for i in range(6)}


def test_a_renamed_file_scores_nothing(setup):
    job, inputs, out = setup
    (inputs / "a.parquet").rename(inputs / "renamed.parquet")
    assert scored(job) == (0, 0)
    check(out, inputs)


@pytest.mark.parametrize(
    "shape",
    ["split", "merge", "compact"],
)
def test_split_merged_or_compacted_files_score_nothing(setup, shape: str):
    job, inputs, out = setup
    everything = input_rows(inputs)
    for p in inputs.glob("*.parquet"):
        p.unlink()
    if shape == "split":  # into three files of new names, rows reordered
        for k in range(3):
            write_rows(inputs / f"part-{k}.parquet", everything.take(list(range(k, 16, 3))))
    elif shape == "merge":
        write_rows(inputs / "all.parquet", everything)
    else:  # compaction: one file, one row group, another writer's layout
        pq.write_table(
            everything.cast(
                pa.schema([("id", pa.large_string()), *[(f"x{j}", pa.float32()) for j in range(4)]])
            ),
            inputs / "compact.parquet",
        )
    assert scored(job) == (0, 0)
    check(out, inputs)


@pytest.mark.parametrize("part_rows", [None, 4])
def test_a_split_with_an_edit_and_an_append_scores_those_rows_alone(
    setup, part_rows: int | None, monkeypatch: pytest.MonkeyPatch
):
    """Also with the diff cut into parts of 4 rows (spilled to files): the path a table of
    more than `PART_ROWS` rows takes."""
    job, inputs, out = setup
    if part_rows:
        monkeypatch.setattr(diff, "PART_ROWS", part_rows)
    everything = input_rows(inputs).to_pydict()
    everything["x1"][12] = 7.0
    rows = pa.concat_tables([pa.table(everything).cast(SCHEMA), rows_table(["n0", "n1"], seed=3)])
    for p in inputs.glob("*.parquet"):
        p.unlink()
    write_rows(inputs / "x.parquet", rows.slice(0, 9))
    write_rows(inputs / "y.parquet", rows.slice(9))
    assert scored(job) == (3, 1)
    check(out, inputs)
    assert scored(job) == (0, 0)


def test_duplicate_ids_are_an_error_naming_files_and_rows(setup):
    job, inputs, out = setup
    write_rows(inputs / "c.parquet", rows_table(["a3", "c1"], seed=4))
    result = invoke("run", str(job))
    assert result.exit_code == 3, result.output
    assert "'a3'" in result.output and "a.parquet row 3" in result.output
    assert "c.parquet row 0" in result.output
    assert glob_ids(out) == sorted(f"a{i}" for i in range(10)) + [f"b{i}" for i in range(6)]


def test_an_id_is_required_and_by_shard_stays_the_default(tmp_path: Path):
    job = rows_job(tmp_path, id="")
    result = invoke("validate", str(job))
    assert result.exit_code == 2 and "[input].increments" in result.output
    shards = tiny_job(tmp_path / "shards")  # no `increments`: by shard, no hash column
    write_rows(tmp_path / "shards/in/a.parquet", rows_table(["a0", "a1"]))
    assert scored(shards) == (2, 0)
    [data] = (tmp_path / "shards/out").glob("*.parquet")
    assert "_row_hash" not in pq.read_schema(data).names


def test_plan_and_status_count_rows_to_score_and_retire_before_the_run(setup):
    job, inputs, _out = setup
    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][1] += 1.0
    write_rows(inputs / "a.parquet", {k: v[:8] for k, v in a.items()})  # one edit, two deleted
    write_rows(inputs / "c.parquet", rows_table(["c0", "c1", "c2"], seed=5))  # three new
    status = job_status(load_job(job))
    assert not status["complete"]
    counts = status["increments"]
    assert (counts["to_score"], counts["new"], counts["changed"]) == (4, 3, 1)
    assert (counts["to_retire"], counts["deleted"]) == (3, 2)
    assert "by rows: 4 to score (3 new, 1 edited), 3 committed row(s) to retire" in (
        invoke("status", str(job)).output
    )
    planned = invoke("plan", str(job), "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["increments"] == counts
    assert json.loads(planned.output)["rows_to_score"] == 4
    assert scored(job) == (4, 3)
    status = job_status(load_job(job))
    assert status["complete"] and status["increments"]["to_score"] == 0


def test_by_shards_the_report_says_why_a_changed_shard_is_scored_whole(tmp_path: Path):
    job = tiny_job(tmp_path)
    write_rows(tmp_path / "in/a.parquet", rows_table(["a0", "a1", "a2"]))
    run_job(load_job(job))
    write_rows(tmp_path / "in/a.parquet", rows_table(["a0", "a1", "a2", "a3"]))
    report = run_job(load_job(job))
    assert report["rows"] == 4  # the whole shard, by shards
    [why] = {r["why"] for r in report["redone"]}
    assert "changed since it was scored" in why and 'increments = "rows"' in why


@pytest.mark.s3
@pytest.mark.parametrize("fmt", FORMATS)
def test_increments_by_row_in_an_object_store(bucket: str, tmp_path: Path, fmt: str):
    """No rename in S3: a partly retired file is rewritten as one whole-object upload (in a
    table, under a new name, swapped for the old in the table's log: Delta's, and Iceberg's,
    read from the bucket alone by its version hint)."""
    out = f"{bucket}/out"
    job, inputs = rows_job(tmp_path, output=out, fmt=fmt), tmp_path / "in"
    write_rows(inputs / "a.parquet", rows_table([f"a{i}" for i in range(10)]))
    write_rows(inputs / "b.parquet", rows_table([f"b{i}" for i in range(6)], seed=1))
    assert scored(job) == (16, 0)
    a = pq.read_table(inputs / "a.parquet").to_pydict()
    a["x0"][5] += 1.0
    write_rows(inputs / "a.parquet", a)
    write_rows(inputs / "b.parquet", pq.read_table(inputs / "b.parquet").take([0, 2, 3, 5]))
    write_rows(inputs / "c.parquet", rows_table(["c0", "c1"], seed=2))
    assert scored(job) == (3, 3)
    fs, base = filesystem(out)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    glob = [i.path for i in infos if i.is_file and i.path.endswith(".parquet")]
    ids = [i for p in glob for i in pq.read_table(p, filesystem=fs)["id"].to_pylist()]
    assert sorted(ids) == sorted(input_rows(inputs)["id"].to_pylist())
    if fmt == "delta":
        dt = deltalake.DeltaTable(out, storage_options=storage_options(out))
        assert sorted(dt.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == sorted(ids)
        assert len(dt.file_uris()) == len(glob)
    if fmt == "iceberg":
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(out, properties=file_io(out, os.environ))
        assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted(ids)
        assert len(list(table.scan().plan_files())) == len(glob)
    assert scored(job) == (0, 0)


def test_a_shard_that_cannot_be_read_retires_nothing(setup):
    """Its rows cannot be told from deleted ones: they stay, new rows elsewhere are scored."""
    job, inputs, out = setup
    (inputs / "b.parquet").write_bytes(b"not parquet any more")
    write_rows(inputs / "c.parquet", rows_table(["c0"], seed=6))
    result = invoke("run", str(job))
    assert result.exit_code == 3, result.output
    assert glob_ids(out) == sorted(
        [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(6)] + ["c0"]
    )
    assert not (out / "_SUCCESS").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_with_an_error_stay_listed_with_their_file_when_it_is_rewritten(
    tmp_path: Path, fmt: str
):
    """A row written with its error (`on_error = "skip"`) stays listed in `rejected/` beside
    the record of the file that holds it, when a retirement rewrites that file (in a Delta
    table, under a new chunk key: the listing moves with it)."""
    job, inputs = rows_job(tmp_path, fmt=fmt), tmp_path / "in"
    rows = rows_table([f"a{i}" for i in range(4)]).to_pydict()
    rows["x1"][1] = None  # a1 cannot be scored: written with its error, listed
    write_rows(inputs / "a.parquet", rows)
    skip = ["output.on_error=skip", "output.max_bad_share=0.5"]
    assert run_job(load_job(job, skip))["rows"] == 4
    rows["x0"][2] += 1.0  # an edit in the same chunk: its file loses a2's old row
    write_rows(inputs / "a.parquet", rows)
    report = run_job(load_job(job, skip))
    assert (report["rows"], report["rows_retired"]) == (1, 1)
    done = tmp_path / "out/_batchscore"
    records = [json.loads(p.read_text()) for p in (done / "done").glob("*.json")]
    [held] = [r for r in records if r["bad_rows"]]
    assert held["bad_rows"] == 1 and held["rows"] == 3
    [listing] = (done / "rejected").glob("*.jsonl")
    assert listing.name == f"{held['chunk']}.jsonl" and '"a1"' in listing.read_text()
    check(tmp_path / "out", inputs)


def pandas_frame(count: int) -> Any:
    """Rows as a pandas user has them: nanosecond moments (whole microseconds), one column of
    them zoned, dates, decimals of mixed scales, a category, features float32."""
    import pandas as pd

    x = np.random.default_rng(0).normal(size=(count, 4)).astype(np.float32)
    start = pd.Timestamp("2024-03-01 12:00:00.123456")
    moments = pd.Series([start + pd.Timedelta(microseconds=7 * i) for i in range(count)])
    return pd.DataFrame(
        {
            "id": np.arange(count, dtype=np.int64),
            **{f"x{j}": x[:, j] for j in range(4)},
            "t": moments.astype("datetime64[ns]"),
            "z": moments.dt.tz_localize("UTC").astype("datetime64[ns, UTC]"),
            "d": [datetime.date(2024, 1, 1 + i % 28) for i in range(count)],
            "m": [
                decimal.Decimal("1.50") if i % 2 else decimal.Decimal(f"{i}.5")
                for i in range(count)
            ],
            "c": pd.Categorical(["en", "de"] * (count // 2) + ["en"] * (count % 2)),
        }
    )


def spark_style(path: Path, **options: Any) -> None:
    """``path`` written again as Spark writes Parquet: no Arrow schema in the footer, no
    dictionaries, small row groups, timestamps as ``options`` say (INT96, or microseconds)."""
    table = pq.read_table(path)
    pq.write_table(
        table, path, store_schema=False, use_dictionary=False, row_group_size=3, **options
    )


def test_an_input_rewritten_by_other_writers_scores_nothing(tmp_path: Path):
    """A by-rows job over a folder pandas wrote, with moments, a zoned moment, dates, decimals
    and a category kept (so hashed): polars writing the same rows again, then Spark (INT96,
    which comes back naive; then microseconds) scores and retires nothing; a row appended in
    Spark's layout is scored alone, written in the folder's types; polars, DuckDB and
    pyarrow.dataset read the folder, one schema throughout."""
    job = rows_job(tmp_path, keep=["t", "z", "d", "m", "c"])
    inputs, out = tmp_path / "in", tmp_path / "out"
    pandas_frame(9).to_parquet(inputs / "a.parquet")
    assert scored(job) == (9, 0)
    pl.read_parquet(inputs / "a.parquet").write_parquet(inputs / "a.parquet")
    assert scored(job) == (0, 0)
    spark_style(inputs / "a.parquet", use_deprecated_int96_timestamps=True)
    assert pq.read_schema(inputs / "a.parquet").field("z").type == pa.timestamp("ns")  # naive
    assert scored(job) == (0, 0)
    spark_style(inputs / "a.parquet", coerce_timestamps="us")
    assert scored(job) == (0, 0)
    pandas_frame(10).to_parquet(inputs / "a.parquet")  # one row appended ...
    spark_style(inputs / "a.parquet", coerce_timestamps="us")  # ... in Spark's layout
    assert scored(job) == (1, 0)
    files = sorted(out.glob("*.parquet"))
    assert len({pq.read_schema(f).remove_metadata() for f in files}) == 1
    glob = pl.read_parquet(str(out / "*.parquet"))
    assert glob.height == 10 and sorted(glob["id"]) == list(range(10))
    con = duckdb.connect()
    assert con.execute(f"select count(*) from '{out}/*.parquet'").fetchone()[0] == 10
    assert ds.dataset([str(f) for f in files]).to_table().num_rows == 10
    check(out, inputs)
