"""`batchscore.score` on the frames a notebook meets: empty ones, duplicate names, object columns
that mix strings with None, NaN and numbers, every Arrow layout of text. It returns the caller's
type with the task's columns after the input's, rows in input order, or raises the package's
own error naming the column (and the row, for a cell); never another exception.

The real MiniLM at fp32, loaded once (`score` keeps it), on a handful of rows per example.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import batchscore
from batchscore.errors import BatchscoreError, InputDataError

FAST = {"threads": 1, "max_length": 32, "precision": "fp32"}
POOL = [
    "Return the sum of the items of an iterable.",
    "class Node: one vertex of a tree",
    "def walk(top): yield every folder below top",
    "The with statement wraps a block in a context manager.",
    "UTF-8 text: naïve café, 日本語",
]
# Arrow and polars string layouts hold strings and nulls; pandas object columns hold anything.
TEXTS = st.one_of(st.sampled_from(POOL), st.none(), st.just(""))
OBJECTS = st.one_of(
    TEXTS,
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.just(b"bytes"),
    st.just(pd.NA),
)
NUMBERS = st.one_of(st.integers(-100, 100), st.none())
LAYOUTS = {
    "arrow": ["string", "large_string", "string_view", "dictionary", "int64", "null"],
    "polars": ["String", "Categorical", "Object", "Int64"],
    "pandas": ["object", "string", "category", "float64"],
}
NUMERIC_LAYOUTS = {"int64", "Int64", "float64"}  # a number column where text is read


def column(library: str, layout: str, cells: list[Any]) -> Any:
    """One column of ``cells`` in a library's own layout."""
    if library == "arrow":
        if layout == "null":
            return pa.nulls(len(cells))
        if layout == "dictionary":
            return pa.array(cells, pa.string()).dictionary_encode()
        return pa.array(cells, getattr(pa, layout)())
    if library == "polars":
        return pl.Series("text", cells, dtype=getattr(pl, layout))
    if layout == "float64":
        return pd.Series([np.nan if c is None else c for c in cells], dtype="float64")
    return pd.Series(cells, dtype=layout)


def build(library: str, layout: str, cells: list[Any], extra: str) -> tuple[Any, ...]:
    """(frame, its text cells, layout, extra): a "text" column of ``cells``, and ``extra``:
    "none", "number" (an int column "x"), "text twice" or "other twice" ("x" twice)."""
    text = column(library, layout, cells)
    numbers = list(range(len(cells)))
    names = {
        "none": ["text"],
        "number": ["text", "x"],
        "text twice": ["text", "x", "text"],
        "other twice": ["x", "text", "x"],
    }[extra]
    if library == "arrow":
        arrays = [text if n == "text" else pa.array(numbers, pa.int64()) for n in names]
        return pa.Table.from_arrays(arrays, names=names), cells, layout, extra
    if library == "polars":
        others = [pl.Series(n, numbers) for n in names[1:]]
        return pl.DataFrame([text, *others]), cells, layout, extra
    frame = pd.concat([text if n == "text" else pd.Series(numbers) for n in names], axis=1)
    frame.columns = names
    frame.index = [10 * i + 3 for i in range(len(cells))]  # an index of the caller's own
    return frame, cells, layout, extra


@st.composite
def frames(draw: st.DrawFn) -> tuple[Any, ...]:
    """A frame of 0-6 rows in any library and layout, with or without other columns."""
    library = draw(st.sampled_from(list(LAYOUTS)))
    layout = draw(st.sampled_from(LAYOUTS[library]))
    cells_of = OBJECTS if layout in ("object", "Object") else TEXTS
    if layout in NUMERIC_LAYOUTS:
        cells_of = NUMBERS
    if layout == "null":
        cells_of = st.none()
    rows = draw(st.integers(0, 6))
    cells = draw(st.lists(cells_of, min_size=rows, max_size=rows))
    extra = draw(st.sampled_from(["none", "number", "text twice", "other twice"]))
    if library == "polars" and extra.endswith("twice"):
        extra = "number"  # polars refuses two columns of one name itself
    return build(library, layout, cells, extra)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """Each pool text's vector, scored alone in one plain call."""
    out = batchscore.score(pa.table({"text": POOL}), task="embed", **FAST)
    vectors = np.asarray(out.column("embedding").to_pylist(), dtype=np.float32)
    return dict(zip(POOL, vectors, strict=True))


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def is_good(cell: Any) -> bool:
    return isinstance(cell, str) and cell != ""


def names_of(frame: Any) -> list[Any]:
    return frame.column_names if isinstance(frame, pa.Table) else list(frame.columns)


def values(frame: Any, name: str) -> list[Any]:
    if isinstance(frame, pa.Table):
        return frame.column(name).to_pylist()
    if isinstance(frame, pl.DataFrame):
        return frame[name].to_list()
    return frame[name].tolist()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=frames(), on_error=st.sampled_from(["fail", "skip"]))
@example(drawn=build("pandas", "float64", [], "none"), on_error="fail")  # pandas' empty column
@example(drawn=build("arrow", "string", [POOL[0]], "text twice"), on_error="fail")
@example(drawn=build("pandas", "object", [POOL[0], 3, None, POOL[1]], "none"), on_error="skip")
@example(drawn=build("pandas", "object", [POOL[0], 2.5], "other twice"), on_error="fail")
@example(drawn=build("polars", "Object", [POOL[2], 7, POOL[3]], "number"), on_error="skip")
def test_score_returns_the_frame_or_names_the_column(
    drawn: tuple[Any, ...], on_error: str, reference: dict[str, np.ndarray]
):
    frame, cells, layout, extra = drawn
    try:
        out = batchscore.score(frame, task="embed", on_error=on_error, **FAST)
    except BatchscoreError as exc:
        message = str(exc)
        event(f"raised: {message.split(': ', 1)[1][:40]}")
        assert isinstance(exc, InputDataError) and "column 'text'" in message, message
        bad = [row for row, cell in enumerate(cells) if not is_good(cell)]
        if extra == "text twice":
            assert "appears 2 times" in message
        elif layout in NUMERIC_LAYOUTS and not all(missing(c) for c in cells):
            assert "expected a string column" in message
        else:  # a row that cannot be scored, which fails the call
            assert on_error == "fail" and bad, message
            assert any(f"row {row}," in message for row in bad), message
        return
    event(f"scored {type(frame).__module__.split('.')[0]} {layout}" + (" (empty)" * (not cells)))
    assert extra != "text twice"
    assert layout not in NUMERIC_LAYOUTS or all(missing(c) for c in cells)  # no number in it
    assert type(out) is type(frame) and len(out) == len(cells)
    added = ["embedding"] + (["error"] if on_error == "skip" else [])
    assert names_of(out) == names_of(frame) + added
    if isinstance(frame, pd.DataFrame):
        assert list(out.index) == list(frame.index)
    vectors = values(out, "embedding")
    errors = values(out, "error") if on_error == "skip" else [None] * len(cells)
    for cell, vector, error in zip(cells, vectors, errors, strict=True):
        if is_good(cell):  # its own vector, in its own row
            assert missing(error)
            assert np.allclose(np.asarray(vector, dtype=np.float32), reference[cell], atol=1e-4)
        else:
            assert on_error == "skip" and vector is None and "column 'text'" in error, error


EMPTY = {
    "arrow": pa.table({"text": pa.array([], pa.string())}),
    "polars": pl.DataFrame({"text": []}, schema={"text": pl.String}),
    "pandas": pd.DataFrame({"text": []}),  # pandas makes this column float64
}


@pytest.mark.parametrize("library", sorted(EMPTY))
def test_an_empty_frame_gets_the_columns_a_full_one_would(library: str):
    frame = EMPTY[library]
    out = batchscore.score(frame, task="embed", on_error="skip", **FAST)
    full = batchscore.score(pa.table({"text": POOL[:2]}), task="embed", on_error="skip", **FAST)
    assert type(out) is type(frame) and len(out) == 0
    assert names_of(out) == ["text", "embedding", "error"]
    if library == "arrow":
        assert out.schema.remove(0) == full.schema.remove(0)
    elif library == "polars":
        assert out.schema["embedding"] == pl.Array(pl.Float32, 384)
        assert out.schema == pl.from_arrow(full).schema


def test_a_number_in_a_text_column_is_a_row_error_naming_its_row():
    frame = pd.DataFrame({"text": [POOL[0], 42, None, POOL[1]]})
    with pytest.raises(InputDataError, match=r"row 1, column 'text': a value of type int"):
        batchscore.score(frame, task="embed", **FAST)
    out = batchscore.score(frame, task="embed", on_error="skip", **FAST)
    errors = out["error"].tolist()
    assert missing(errors[0]) and missing(errors[3])
    assert errors[1:3] == [
        "column 'text': a value of type int, not a string",
        "column 'text': text is null",
    ]
    assert out["embedding"][1] is None and out["embedding"][3] is not None
