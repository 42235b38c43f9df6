"""Data frames in and out of `batchscore.score`: a pyarrow Table, a polars DataFrame or a pandas
DataFrame becomes the Arrow table of the columns the task reads, and the scored columns go back
onto the caller's own frame, so it gets the type (and, for pandas, the index) it passed in.

pandas is optional: it is recognised by its module and never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from batchscore.errors import JobError


def library(data: Any) -> str | None:
    """ "arrow", "polars" or "pandas" for a frame batchscore can score; None for anything else."""
    if isinstance(data, pa.Table):
        return "arrow"
    if isinstance(data, pl.DataFrame):
        return "polars"
    pandas = type(data).__module__.split(".", 1)[0] == "pandas"
    if pandas and hasattr(data, "columns") and hasattr(data, "index"):
        return "pandas"
    return None


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
                f"score(): data must be a pyarrow Table, a polars DataFrame or a pandas "
                f"DataFrame, got {type(data).__module__}.{type(data).__qualname__}"
            )
        return cls(data, kind)

    @property
    def names(self) -> list[str]:
        if self.kind == "arrow":
            return list(self.data.column_names)
        return [str(c) for c in self.data.columns]

    def arrow(self, columns: list[str]) -> pa.Table:
        """The named columns as an Arrow table (pandas' index is left out: it is not data)."""
        if self.kind == "arrow":
            return self.data.select(columns)
        if self.kind == "polars":
            return self.data.select(columns).to_arrow()
        return pa.Table.from_pandas(self.data[columns], preserve_index=False)

    def with_columns(self, scored: pa.Table) -> Any:
        """The caller's frame, every column as it was, with ``scored``'s columns after them."""
        if self.kind == "arrow":
            table = self.data
            for field, column in zip(scored.schema, scored.columns, strict=True):
                table = table.append_column(field, column)
            return table
        if self.kind == "polars":
            return self.data.hstack(pl.from_arrow(scored).get_columns())
        added = {}
        for name, column in zip(scored.column_names, scored.columns, strict=True):
            series = column.to_pandas()
            series.index = self.data.index  # the caller's index, whatever it is
            added[name] = series
        return self.data.assign(**added)
