"""Fuzzing `batchscore run` with hostile shards: Hypothesis builds Arrow tables (column names that
clash or repeat, types and layouts of every kind, nulls, odd and undecodable strings, huge and
tiny numbers), writes them as shards and runs the real CLI in-process on the real MiniLM.

Whatever the input: the exit status is one the README documents, no traceback reaches the user,
every row of a shard that committed is there once (scored, or with its error), and every shard
that did not commit is named in the message.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.errors import EXIT_CODES
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
            model={"task": "embed", "max_length": 16, "threads": 1},
            output={"path": "out", "on_error": "skip" if skip else "fail", "max_bad_share": 1.0},
        )
        result = CliRunner().invoke(main, ["run", str(job), "--progress", "off"])
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
