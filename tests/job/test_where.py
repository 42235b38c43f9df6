"""`[input].where`: the predicate alone, then a real job that filters while streaming: the
output holds exactly the passing rows in input order, the rest are counted, and the filter
is part of the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.errors import JobError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import InputConfig
from batchscore.job.where import RowFilter, where_problem
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from tests.commands import invoke
from tests.conftest import read_output
from tests.reliability import make_job

TABLE = pa.table({"lang": ["en", "de", None, "en"], "n": [1, 2, 3, 4], "text": list("abcd")})


@pytest.mark.parametrize(
    ("where", "kept"),
    [
        ("lang = 'en'", [0, 3]),
        ("lang <> 'en'", [1]),  # NULL is not "not en": SQL's three-valued logic drops it
        ("n > 1 AND (lang = 'en' OR lang IS NULL)", [2, 3]),
        ("text IN ('a', 'd') OR n = 2", [0, 1, 3]),
        ("1 = 1", [0, 1, 2, 3]),
    ],
)
def test_rows_kept(where: str, kept: list[int]):
    assert RowFilter(where).check(TABLE.schema) is None
    assert RowFilter(where).keep(TABLE).tolist() == kept


def test_problems_are_named():
    assert "not a SQL predicate" in where_problem("lang = = 'en'")
    assert "is empty" in where_problem("  ")
    assert where_problem("lang = 'en'") is None
    assert "names column(s) body the input lacks" in RowFilter("body = 'x'").check(TABLE.schema)
    assert "not true or false" in RowFilter("n + 1").check(TABLE.schema)


def test_the_input_section_gives_its_filter():
    """One way to a job's filter: its `[input]` section, none when every row is kept."""
    assert InputConfig(path=("in",)).row_filter is None
    kept = InputConfig(path=("in",), where="lang = 'en' AND n > 1").row_filter
    assert kept == RowFilter("lang = 'en' AND n > 1") and kept.columns == ("lang", "n")


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 120))


def test_output_holds_the_passing_rows_in_input_order(job: Path, tmp_path: Path):
    where = "kind = 'function' AND length(text) > 80"
    report = run_job(load_job(job, [f'input.where="{where}"', "input.keep=['kind']"]))
    shards = sorted((tmp_path / "in").glob("*.parquet"))
    rows = pa.concat_tables(pq.read_table(s) for s in shards).to_pylist()
    want = [r["doc_id"] for r in rows if r["kind"] == "function" and len(r["text"]) > 80]
    assert 10 < len(want) < 110
    out = read_output(tmp_path / "out")
    assert out["doc_id"].to_pylist() == want and set(out["kind"].to_pylist()) == {"function"}
    assert report["rows"] == len(want) and report["filtered"] == 120 - len(want)
    assert report["chunks_committed"] == 9  # chunks stay fixed ranges of the input
    records = [json.loads(p.read_text()) for p in (tmp_path / "out/_batchscore/done").glob("*")]
    assert sum(r["rows"] for r in records) == len(want)
    assert all(r["rows"] + r["filtered"] == r["stop"] - r["start"] for r in records)
    assert all(pq.read_metadata(tmp_path / "out" / r["file"]).num_rows == r["rows"]
               for r in records)  # fmt: skip
    status = job_status(load_job(job, [f'input.where="{where}"', "input.keep=['kind']"]))
    assert status["complete"] and status["rows_done"] == 120
    assert status["rows_written"] == len(want)
    # same values as scoring those rows unfiltered
    full = read_output(Path(run_job(load_job(job, ['output.path="all"']))["output"]))
    picked = full.filter(pa.compute.is_in(full["doc_id"], pa.array(want)))
    assert np.allclose(np.array(out["embedding"].to_pylist()),
                       np.array(picked["embedding"].to_pylist()), atol=1e-6)  # fmt: skip


def test_filter_that_drops_a_whole_chunk_commits_it_empty(job: Path, tmp_path: Path):
    report = run_job(load_job(job, ["input.where=\"doc_id < ''\""]))
    assert report["rows"] == 0 and report["filtered"] == 120 and report["chunks_committed"] == 9
    assert read_output(tmp_path / "out").num_rows == 0


def test_changing_the_filter_refuses_to_mix_outputs(job: Path):
    run_job(load_job(job, ["input.where=\"doc_id > 'm'\""]))
    with pytest.raises(OutputConflictError, match="changed: where"):
        run_job(load_job(job, ["input.where=\"doc_id > 'n'\""]))


def test_missing_column_is_a_validation_error(job: Path):
    with pytest.raises(JobError, match=r"\[input\]\.where: names column\(s\) lang"):
        run_job(load_job(job, ["input.where=\"lang = 'en'\""]))
    result = invoke("validate", str(job), "--set", "input.where=\"lang = 'en'\"")
    assert result.exit_code == 2 and "names column(s) lang the input lacks" in result.stderr
    with pytest.raises(JobError, match=r"\[input\]\.where: not a SQL predicate"):
        load_job(job, ["input.where=\"lang = = 'en'\""])
