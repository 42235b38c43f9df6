"""Column names that differ only in case are one column to DuckDB, Spark and Hive: a carried
column may not differ only in case from an output column, nor from another carried column."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchscore
from batchscore.errors import JobError
from batchscore.job.parse import job_from_dict
from batchscore.job.sections import ClassifyConfig
from batchscore.models.tasks import TASKS, check_outputs
from tests.commands import invoke

ALL_SCORES = ClassifyConfig(all_scores=True)  # classify with every column it can write
OUTPUTS = sorted({n for task in TASKS.values() for n in task.output_names(ALL_SCORES)} | {"error"})
NAMES = ["id", "doc_id", "text", "lang", *OUTPUTS]


@st.composite
def spelled(draw: st.DrawFn, names: list[str] = NAMES) -> str:
    """A known column name with each letter's case drawn, or any other name."""
    if draw(st.booleans()):
        return draw(st.text(min_size=1, max_size=8))
    name = draw(st.sampled_from(names))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if f else c for c, f in zip(name, flips, strict=True))


def raw_job(task: str, *, id: str | None, keep: list[str], on_error: str = "fail") -> dict:
    inp: dict = {"path": "in", "keep": keep} | ({"id": id} if id is not None else {})
    if task == "tensor":
        inp["features"] = ["x0"]
    if task == "reward":  # a prompt and a response
        inp["text_pair"] = "response"
    model = {"task": task} | ({} if task == "embed" else {"path": "m"})
    raw = {"input": inp, "model": model, "output": {"path": "out", "on_error": on_error}}
    if task == "tensor":
        raw["tensor"] = {"output": "class"}
    if task == "classify":
        raw["classify"] = {"all_scores": True}
    return raw


def outputs_of(task: str, on_error: str) -> set[str]:
    names = TASKS[task].output_names(ALL_SCORES)
    return {*names, *(["error"] if on_error == "skip" else [])}


@settings(max_examples=400, deadline=None)
@given(
    task=st.sampled_from(sorted(TASKS)),
    on_error=st.sampled_from(["fail", "skip"]),
    id=st.none() | spelled(),
    keep=st.lists(spelled(), max_size=3),
)
def test_a_carried_column_one_with_another_to_a_case_blind_reader_is_refused(
    task, on_error, id, keep, tmp_path_factory
):
    source = tmp_path_factory.getbasetemp() / "job.toml"
    carried = list(dict.fromkeys(([id] if id is not None else []) + keep))
    folded = [c.casefold() for c in carried]
    twins = len(set(folded)) < len(folded)
    outputs = {o.casefold() for o in outputs_of(task, on_error)}
    meets_output = any(f in outputs for f in folded)
    try:
        job = job_from_dict(raw_job(task, id=id, keep=keep, on_error=on_error), source)
        check_outputs(job)
    except JobError as exc:
        assert twins or meets_output, exc.problems
        assert all("[input].id/keep: column" in p for p in exc.problems), exc.problems
        assert any(name in str(exc) for name in (repr(c) for c in carried))
    else:
        assert not twins, f"{carried} holds two names a case-blind reader takes for one"
        assert not meets_output, f"{carried} meets an output column of {task}"


def test_validate_refuses_label_beside_classify_label_and_duckdb_shows_why(tmp_path: Path):
    # the reason: a file holding both, as the output would, reads as one column in DuckDB
    both = tmp_path / "both.parquet"
    pq.write_table(pa.table({"Label": ["kept"], "label": ["predicted"]}), both)
    assert duckdb.sql(f"select label from '{both}'").fetchall() == [("kept",)]

    shards = tmp_path / "in"
    shards.mkdir()
    pq.write_table(pa.table({"text": ["a b"], "Label": ["x"], "ID": [1], "id": [2]}),
                   shards / "a.parquet")  # fmt: skip
    for inp, said in (
        ({"keep": ["Label"]}, "column 'Label' differs only in case from the output column 'label'"),
        ({"id": "ID", "keep": ["id"]}, "columns 'ID' and 'id' differ only in case"),
    ):
        job = tmp_path / "job.toml"
        job.write_text(
            f"[input]\npath = {json.dumps(str(shards))}\n"
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in inp.items())
            + '[model]\ntask = "classify"\npath = "m"\n[output]\npath = "out"\n'
        )
        result = invoke("validate", str(job), catch=False)
        assert result.exit_code == 2, result.output
        assert said in result.stderr and "[input].id/keep" in result.stderr


@pytest.mark.parametrize("name", ["doc_id", "Kind"])
def test_the_same_name_twice_is_still_one_column(name: str, tmp_path: Path):
    job = job_from_dict(raw_job("embed", id=name, keep=[name, name]), tmp_path / "job.toml")
    check_outputs(job)
    assert job.input.carried == (name,)


def test_score_refuses_a_frame_column_that_differs_only_in_case_from_one_it_writes():
    frame = pa.table({"text": ["a short text", "another"], "Embedding": [1, 2]})
    with pytest.raises(JobError, match=r"already has column\(s\) Embedding, which task embed"):
        batchscore.score(frame, task="embed", precision="fp32", max_tokens=4096, threads=1)
