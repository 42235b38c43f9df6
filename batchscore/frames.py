"""Data frames in and out of `batchscore.score`: a pyarrow Table, a polars DataFrame or a pandas
DataFrame becomes the Arrow table of the columns the task reads, and the scored columns go back
onto the caller's own frame, so it gets the type (and, for pandas, the index) it passed in.

A frame is read as a notebook holds it. A pandas or polars object column may mix strings with
None, NaN or a number: a cell that is not a string becomes null and is reported as its row's
error, as a null is (the row fails, or under ``on_error = "skip"`` carries its error). A column
with no value has no type to read (pandas makes an empty or all-NaN column float64, an all-None
categorical one of floats): a text column is then read as text, all null. Nothing here raises
anything but the package's own errors.

Texts alone are read too, as sentence-transformers' ``encode`` takes them: a list (or tuple)
of strings, a pandas or polars Series, a 1-D numpy array, or one string. They come back as
``encode`` gives them, in input order: one vector output as a 2-D numpy array (one row per
text; one vector for one string), another single output as a list of its values, several
outputs (classify's label and score) as a list of dicts.

pandas is optional: it is recognised by its module and never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from batchscore.errors import InputDataError, JobError
from batchscore.pipeline.score_table import MEMORY
from batchscore.work.shards import is_text

TEXT = "text"  # the column texts are read into


def library(data: Any) -> str | None:
    """ "arrow", "polars" or "pandas" for a frame batchscore can score; "texts" for texts
    alone, "text" for one string; None for anything else."""
    if isinstance(data, pa.Table):
        return "arrow"
    if isinstance(data, pl.DataFrame):
        return "polars"
    if isinstance(data, str):
        return "text"
    pandas = type(data).__module__.split(".", 1)[0] == "pandas"
    if pandas and hasattr(data, "columns") and hasattr(data, "index"):
        return "pandas"
    series = pandas and type(data).__name__ == "Series"
    if isinstance(data, list | tuple | pl.Series) or series:
        return "texts"
    if isinstance(data, np.ndarray) and data.ndim == 1:
        return "texts"
    return None


def texts_of(data: Any) -> list[Any]:
    """Texts alone as a list; an item that is neither a string nor missing (a dict, a number)
    is refused, naming it: it is no text, and there is no column to report it in."""
    values = [data] if isinstance(data, str) else list(data)
    for item, value in enumerate(values):
        if not isinstance(value, str) and not is_null(value):
            raise JobError(
                f"score(): item {item} of the texts is a {type(value).__name__}, not a string; "
                "pass texts, or a pyarrow Table, polars DataFrame or pandas DataFrame"
            )
    return values


@dataclass
class Read:
    """The columns a task reads, as Arrow, and the cells that could not be read as their
    column's kind, nulled in ``table``: row -> what was wrong, as a row error says it."""

    table: pa.Table
    bad: dict[int, str] = field(default_factory=dict)


@dataclass
class Frame:
    """The caller's frame and the library it comes from."""

    data: Any
    kind: str

    @classmethod
    def of(cls, data: Any) -> Frame:
        kind = library(data)
        if kind is None:
            raise JobError(
                f"score(): data must be texts (a list of strings, a Series), a pyarrow Table, "
                f"a polars DataFrame or a pandas DataFrame, got "
                f"{type(data).__module__}.{type(data).__qualname__}"
            )
        return cls(texts_of(data), kind) if kind in ("texts", "text") else cls(data, kind)

    @property
    def texts(self) -> bool:
        """Whether the caller passed texts alone (a list, a Series, a string), not a frame."""
        return self.kind in ("texts", "text")

    @property
    def names(self) -> list[str]:
        if self.texts:
            return [TEXT]
        if self.kind == "arrow":
            return list(self.data.column_names)
        return [str(c) for c in self.data.columns]

    def arrow(self, kinds: dict[str, str]) -> Read:
        """The columns of ``kinds`` (name -> "text" or "numeric") as an Arrow table, pandas'
        index left out (it is not data). Each must be there, once."""
        missing = [c for c in kinds if c not in self.names]
        if missing:
            raise InputDataError(
                f"{MEMORY}: missing column(s) {', '.join(missing)}; it has {', '.join(self.names)}"
            )
        for name in kinds:
            if (count := self.names.count(name)) > 1:
                raise InputDataError(
                    f"{MEMORY}: column {name!r} appears {count} times; a column the task reads "
                    "must have one name of its own"
                )
        bad: dict[int, str] = {}
        arrays = [self.column(name, kind, bad) for name, kind in kinds.items()]
        return Read(pa.table(arrays, names=list(kinds)), dict(sorted(bad.items())))

    def column(self, name: str, kind: str, bad: dict[int, str]) -> pa.Array | pa.ChunkedArray:
        """One column as Arrow; the rows of cells that are not text go into ``bad``."""
        found: Any
        if self.texts:  # a list of strings and missing values (`texts_of`)
            array, cells = text_cells(name, self.data)
            bad.update(cells)
            return array
        if self.kind == "arrow":
            found = self.data.column(name)
        elif self.kind == "polars":
            found = self.data.get_column(name)
        else:  # by position: a pandas label may be a number, its name its text
            found = self.data.iloc[:, self.names.index(name)]
        if self.kind in ("polars", "pandas") and is_objects(found, self.kind):
            values = found.to_list()
            if kind != "text":
                return numbers(name, values)
            array, cells = text_cells(name, values)
            for row, message in cells.items():
                bad.setdefault(row, message)
            return array
        if self.kind in ("polars", "pandas"):
            found = to_arrow(name, found, self.kind)
        if kind == "text" and found.null_count == len(found) and not is_text(found.type):
            return pa.nulls(len(found), pa.string())  # no value: no type to tell, none refused
        return found

    def with_columns(self, scored: pa.Table) -> Any:
        """The caller's frame, every column as it was, with ``scored``'s columns after them;
        for texts alone, the outputs as `encode` returns them (see `outputs`)."""
        if self.texts:
            result = outputs(scored)
            return result[0] if self.kind == "text" else result
        if self.kind == "arrow":
            table = self.data
            for field_, column in zip(scored.schema, scored.columns, strict=True):
                table = table.append_column(field_, column)
            return table
        if self.kind == "polars":
            return self.data.hstack(pl.from_arrow(scored).get_columns())
        added = {}
        for name, column in zip(scored.column_names, scored.columns, strict=True):
            series = column.to_pandas()
            series.index = self.data.index  # the caller's index, whatever it is
            added[name] = series
        return self.data.assign(**added)


def outputs(scored: pa.Table) -> np.ndarray | list[Any]:
    """A task's outputs for texts: one fixed-width vector column as a float array of one row
    per text (as `encode` returns it); one other column as a list of its values; several as
    a list of dicts, one per text."""
    if scored.num_columns == 1:
        column = scored.column(0)
        if pa.types.is_fixed_size_list(column.type) and not column.null_count:
            width = column.type.list_size
            values = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
            return values.reshape(len(column), width)
        return column.to_pylist()
    return scored.to_pylist()


def is_objects(column: Any, kind: str) -> bool:
    """Whether a pandas or polars column holds Python objects (a cell may be anything)."""
    if kind == "polars":
        return column.dtype == pl.Object
    return str(column.dtype) == "object"


def to_arrow(name: str, column: Any, kind: str) -> pa.Array:
    """A typed pandas or polars column as Arrow; one Arrow cannot hold is named."""
    try:
        return column.to_arrow() if kind == "polars" else pa.array(column, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise InputDataError(f"{MEMORY}: column {name!r} cannot be read: {exc}") from None


def text_cells(name: str, values: list[Any]) -> tuple[pa.Array, dict[int, str]]:
    """An object column as Arrow strings: a string as it is; None, NaN and the like as null;
    anything else null too, its row reported ("a value of type float, not a string")."""
    cells: list[str | None] = []
    bad: dict[int, str] = {}
    for row, value in enumerate(values):
        if isinstance(value, str) and is_utf8(value):
            cells.append(value)
            continue
        cells.append(None)
        if isinstance(value, str):
            bad[row] = f"column {name!r}: text is not valid Unicode (a lone surrogate)"
        elif not is_null(value):
            bad[row] = f"column {name!r}: a value of type {type(value).__name__}, not a string"
    return pa.array(cells, pa.string()), bad


def numbers(name: str, values: list[Any]) -> pa.Array:
    """An object column the task reads numbers from, as Arrow; a cell that is not a number is
    named by its row."""
    try:
        return pa.array(values, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError):
        pass
    for row, value in enumerate(values):
        if not (is_null(value) or isinstance(value, int | float)):
            raise InputDataError(
                f"{MEMORY}: row {row}, column {name!r}: a value of type {type(value).__name__}, "
                "not a number"
            )
    raise InputDataError(f"{MEMORY}: column {name!r} mixes numbers that Arrow cannot hold")


def is_null(value: Any) -> bool:
    """Whether a cell is a missing value as pandas and Arrow read it (None, NaN, NA, NaT)."""
    try:
        return pa.array([value], from_pandas=True).null_count == 1
    except (pa.ArrowException, TypeError, ValueError):
        return False


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
