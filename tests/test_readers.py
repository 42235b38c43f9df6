"""An output folder read by the README's own lines: pyarrow, pandas, polars and DuckDB, the
vector width each sees, and DuckDB's cosine through the README's cast."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import ROOT, write_job

SECTION = (ROOT / "README.md").read_text().split("## The output folder", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.S)
ROWS = 44


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory, corpus: pa.Table) -> Path:
    """An embed job's complete output folder (``_SUCCESS`` and ``_batchscore/`` in it), over
    rows that include the document the README's query starts from."""
    root = tmp_path_factory.mktemp("readers")
    first = corpus.filter(pc.is_in(corpus["doc_id"], pa.array(["json", "csv"])))
    assert sorted(first["doc_id"].to_pylist()) == ["csv", "json"]
    rows = pa.concat_tables([first, corpus.slice(0, ROWS - 2)])
    assert rows.num_rows == ROWS
    (root / "in").mkdir()
    for i in range(2):
        pq.write_table(rows.slice(i * 22, 22), root / "in" / f"part-{i}.parquet")
    job = write_job(
        root / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        output={"path": "out", "chunk_rows": 10},
    )
    run_job(load_job(job))
    assert (root / "out" / "_SUCCESS").exists() and (root / "out" / "_batchscore").is_dir()
    return root / "out"


def test_the_readme_reads_the_folder_in_each_library(out: Path, monkeypatch):
    monkeypatch.chdir(out.parent)
    lines = [line for line in BLOCKS[0].splitlines() if line.strip()]
    assert lines[0].startswith("import ") and lines[-1].startswith("spark.read.parquet")
    scope: dict = {}
    exec(lines[0], scope)  # the imports, as printed
    results = [eval(line.split("  #")[0], scope) for line in lines[1:-1]]  # Spark is not here
    arrow, pandas, polars, duck = results
    assert arrow.num_rows == pandas.shape[0] == polars.height == ROWS
    assert duck.shape == (ROWS, 2)
    # the width of a vector, as each reader sees it
    assert arrow.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert polars.schema["embedding"] == pl.Array(pl.Float32, 384)
    assert str(dict(zip(duck.columns, duck.types, strict=True))["embedding"]) == "FLOAT[]"


def test_the_globs_the_readme_warns_about_do_trip_on_success(out: Path, monkeypatch):
    monkeypatch.chdir(out.parent)
    with pytest.raises(Exception, match=r"_SUCCESS|parquet|magic|footer"):
        pl.read_parquet("out")
    with pytest.raises(duckdb.Error, match=r"_SUCCESS|parquet|magic"):
        duckdb.sql("select * from read_parquet('out/*')").fetchall()


def test_duckdb_cosine_through_the_readme_cast(out: Path, monkeypatch):
    monkeypatch.chdir(out.parent)
    scope: dict = {}
    exec(BLOCKS[0].splitlines()[0], scope)
    query = BLOCKS[1].strip()
    assert "::FLOAT[384]" in query and "array_cosine_similarity" in query
    rows = eval(query, scope).fetchall()
    assert len(rows) == 5 and rows[0][0] == "json" and rows[0][1] == pytest.approx(1.0, abs=1e-5)
    # the same cosines from the vectors pyarrow reads
    table = pl.read_parquet("out/**/*.parquet", hive_partitioning=False)
    vectors = dict(zip(table["doc_id"], table["embedding"].to_numpy(), strict=True))
    for doc_id, cosine in rows:
        a, b = vectors["json"], vectors[doc_id]
        assert cosine == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), 1e-5)
    assert [c for _, c in rows] == sorted((c for _, c in rows), reverse=True)
