"""Fuzzing `batchscore run` with hostile shards: Hypothesis builds Arrow tables (column names that
clash or repeat, types and layouts of every kind, nulls, odd and undecodable strings, huge and
tiny numbers), writes them as shards and runs the real CLI in-process on the real MiniLM.

Whatever the input: the exit status is one the README documents, no traceback reaches the user,
every row of a shard that committed is there once (scored, or with its error), and every shard
that did not commit is named in the message.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.errors import EXIT_CODES
from tests.commands import invoke
from tests.conftest import output_files, source_of, write_job

pytestmark = pytest.mark.slow
ODD = "\x00\u200b\ufeff\u2060 \t\nAaé漢字🙂\u202e"
TEXT = st.one_of(
    st.none(),
    st.text(alphabet=st.sampled_from(ODD), max_size=12),
    st.text(max_size=40),
    st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80x", b"ok\xc3"]),  # not valid UTF-8
)
TEXT_LAYOUTS = ["string", "large_string", "string_view", "dictionary"]
LAYOUTS = st.one_of(  # mostly text, sometimes not text at all
    st.sampled_from(TEXT_LAYOUTS),
    st.sampled_from(TEXT_LAYOUTS),
    st.sampled_from(TEXT_LAYOUTS),
    st.sampled_from(["binary", "int64", "null"]),
)
EXTRA_NAMES = ["a", "text", "doc_id", "embedding", "error", " spaced name ", "ünï"]


def text_column(values: list, layout: str) -> pa.Array:
    """``values`` in one Arrow layout; bytes go in unchecked, valid UTF-8 or not."""
    if layout == "int64":
        return pa.array([len(v) if v is not None else None for v in values], pa.int64())
    if layout == "null":
        return pa.nulls(len(values))
    raw = pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())
    if layout == "binary":
        return raw
    strings = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())
    if layout == "dictionary":
        return strings.dictionary_encode()
    return strings if layout == "string" else strings.cast(getattr(pa, layout)())


@st.composite
def shards(draw: st.DrawFn) -> list[pa.Table]:
    tables = []
    for _ in range(draw(st.integers(1, 3))):
        rows = draw(st.integers(0, 6))
        texts = draw(st.lists(TEXT, min_size=rows, max_size=rows))
        names, columns = [], []
        if draw(st.integers(0, 9)):  # now and then the id column is missing
            names.append("doc_id")
            kind = draw(st.sampled_from(["string", "string", "string", "int"]))
            ids = [f"d{i}" if kind == "string" else i for i in range(rows)]
            columns.append(pa.array(ids))
        if draw(st.integers(0, 9)):  # now and then a shard has no text column at all
            names.append("text")
            columns.append(text_column(texts, draw(LAYOUTS)))
        for name in draw(st.lists(st.sampled_from(EXTRA_NAMES), max_size=2)):
            names.append(name)
            number = draw(st.sampled_from([0.0, 1e-300, 1e300, -1e308, float("nan")]))
            columns.append(pa.array([number] * rows, pa.float64()))
        tables.append(pa.Table.from_arrays(columns, names))
    return tables


MODEL = "all-MiniLM-L6-v2"


@settings(
    max_examples=int(os.environ.get("BATCHSCORE_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(tables=shards(), skip=st.booleans())
def test_any_input_gets_a_documented_answer(tables: list[pa.Table], skip: bool):
    with tempfile.TemporaryDirectory(prefix="bs-fuzz-") as tmp:
        folder = Path(tmp)
        (folder / "in").mkdir()
        paths = []
        for i, table in enumerate(tables):
            paths.append(folder / "in" / f"s{i}.parquet")
            pq.write_table(table, paths[-1])
        job = write_job(
            folder / "job.toml",
            input={"path": "in", "text": "text", "id": "doc_id"},
            model={"task": "embed", "name": MODEL, "max_length": 16, "threads": 1},
            output={"path": "out", "on_error": "skip" if skip else "fail", "max_bad_share": 1.0},
        )
        result = invoke("run", str(job), "--progress", "off")
        # exit 4 is the model's failure, never the input's: its message names the model
        assert result.exit_code != 4 or MODEL in result.output, result.output
        assert result.exit_code in EXIT_CODES, (result.exit_code, result.output)
        assert result.exit_code != 1 and "Traceback" not in result.output, result.output
        committed = {}
        for file in output_files(folder / "out") if (folder / "out").is_dir() else []:
            committed.setdefault(source_of(file), []).append(pq.read_table(file))
        for path, table in zip(paths, tables, strict=True):
            parts = committed.get(str(path.resolve()))
            if parts is None:  # not committed: said so, by name (or the job was refused)
                assert result.exit_code != 0 and (path.name in result.stderr or
                                                  result.exit_code in (2, 4, 5))  # fmt: skip
                continue
            out = pa.concat_tables(parts)
            assert out.num_rows == table.num_rows  # every row once
            for row in out.to_pylist():
                scored = row["embedding"] is not None
                assert scored != bool(row.get("error")), row  # scored, or with its error


# -- folders of many shards, each written its own way ----------------------------------------

WORDS = st.text(alphabet=st.sampled_from("abcdefgh "), min_size=1, max_size=12).map(
    lambda s: s.strip() or "x"
)
WRITERS = ["pyarrow", "polars", "pandas"]  # string (or as drawn), large_string, dictionary


@st.composite
def good_shard(draw: st.DrawFn, first_id: int) -> pa.Table:
    """Rows that score, in the layouts real writers give them: a text column of any string
    layout, an id of int32 or int64, a kept column in its own layout."""
    rows = draw(st.integers(0, 5))
    texts = draw(st.lists(WORDS, min_size=rows, max_size=rows))
    ids = pa.array(
        range(first_id, first_id + rows), draw(st.sampled_from([pa.int32(), pa.int64()]))
    )
    text = text_column(texts, draw(st.sampled_from(TEXT_LAYOUTS)))
    kind = text_column([t[:1] for t in texts], draw(st.sampled_from(TEXT_LAYOUTS)))
    return pa.table({"doc_id": ids, "text": text, "kind": kind})


def write_shard(table: pa.Table, path: Path, writer: str) -> None:
    """``table`` written by pyarrow as it is, by polars (text as large_string), or by pandas
    (text as a categorical: a dictionary in the file)."""
    if writer == "polars":
        import polars as pl

        wide = [f if f.name == "doc_id" else f.with_type(pa.large_string()) for f in table.schema]
        plain = table.cast(pa.schema(wide))
        pl.from_arrow(plain).write_parquet(path)
    elif writer == "pandas":
        frame = table.to_pandas()
        frame["text"] = frame["text"].astype("category")
        frame.to_parquet(path, index=False)
    else:
        pq.write_table(table, path, row_group_size=2)


@st.composite
def mixed_folders(draw: st.DrawFn) -> list[tuple[str, pa.Table | None]]:
    """2 to 4 shards in sorted order, each good (in a writer's layout) or bad: truncated, or
    with two columns named ``text``. Returns (how, table) per shard, table None when bad."""
    shards = []
    for i in range(draw(st.integers(2, 4))):
        how = draw(st.sampled_from([*WRITERS, *WRITERS, "truncated", "duplicate"]))
        shards.append((how, draw(good_shard(first_id=100 * i))))
    return shards


def write_folder(folder: Path, shards: list[tuple[str, pa.Table]], cut: float) -> list[Path]:
    paths = []
    for i, (how, table) in enumerate(shards):
        path = folder / f"s{i}.parquet"
        if how == "duplicate":
            names = [*table.column_names, "text"]
            table = pa.Table.from_arrays([*table.columns, table["text"]], names)
        write_shard(table, path, how if how in WRITERS else "pyarrow")
        if how == "truncated":
            data = path.read_bytes()
            path.write_bytes(data[: int(len(data) * cut)])
        paths.append(path)
    return paths


@settings(
    max_examples=int(os.environ.get("BATCHSCORE_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    shards=mixed_folders(),
    cut=st.floats(0.1, 0.95),
    precision=st.sampled_from(["fp32", "auto"]),
    max_tokens=st.sampled_from([4096, "auto"]),
)
def test_one_bad_shard_never_stops_the_others(
    shards: list[tuple[str, pa.Table]], cut: float, precision: str, max_tokens: int | str
):
    """Shards of one folder written by pyarrow, polars and pandas (text as string,
    large_string or dictionary; ids int32 or int64), some truncated or with a column named
    twice: whatever the precision and budget, every good shard commits exactly its rows, in one
    output schema, and every bad one fails alone, named (exit 3); `plan` names them too."""
    with tempfile.TemporaryDirectory(prefix="bs-mixed-") as tmp:
        folder = Path(tmp)
        (folder / "in").mkdir()
        paths = write_folder(folder / "in", shards, cut)
        job = write_job(
            folder / "job.toml",
            input={"path": "in", "text": "text", "id": "doc_id", "keep": ["kind"]},
            model={"task": "embed", "max_length": 16, "threads": 1, "precision": precision},
            batching={"max_tokens": max_tokens},
            quality={"sample_rows": 8},
            output={"path": "out"},
        )
        bad = [p for p, (how, _) in zip(paths, shards, strict=True) if how not in WRITERS]
        planned = invoke("plan", str(job), "--json")
        assert planned.exit_code == 0 and "Traceback" not in planned.output, planned.output
        failing = {f["shard"] for f in json.loads(planned.stdout)["failures"]}
        assert failing == {str(p.resolve()) for p in bad}

        result = invoke("run", str(job), "--progress", "off")
        assert "Traceback" not in result.output, result.output
        assert result.exit_code == (3 if bad else 0), result.output
        committed: dict[str, list[pa.Table]] = {}
        for file in output_files(folder / "out"):
            committed.setdefault(source_of(file), []).append(pq.read_table(file))
        schemas = {t.schema.remove_metadata() for parts in committed.values() for t in parts}
        assert len(schemas) <= 1, schemas  # one output schema, whatever wrote each shard
        for path, (how, table) in zip(paths, shards, strict=True):
            name, parts = path.name, committed.get(str(path.resolve()))
            if how not in WRITERS:
                assert parts is None and name in result.stderr, (how, result.stderr)
                continue
            assert parts is not None and name not in result.stderr, (name, result.stderr)
            out = pa.concat_tables(parts)
            assert out["doc_id"].to_pylist() == table["doc_id"].to_pylist()
            assert out["kind"].to_pylist() == table["kind"].to_pylist()
            assert out["embedding"].null_count == 0
