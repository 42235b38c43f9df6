"""`[input].where`: a SQL predicate over input columns (polars SQL), applied window by window.

The filter runs in the reader thread on each bounded window, so memory stays bounded however
selective it is. A row whose predicate is false or NULL (SQL's three-valued logic) is dropped:
it is counted, never written. Chunks stay fixed row ranges of the unfiltered shard, so a
resumed run filters exactly the same rows again.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import JobError


@functools.cache
def parse(where: str) -> Any:
    """The polars expression for ``where``; raises ValueError saying why it does not parse."""
    import polars as pl

    try:
        return pl.sql_expr(where)
    except Exception as exc:  # polars raises its own SQL error types
        raise ValueError(f"not a SQL predicate polars can read: {exc}") from None


def where_problem(where: str) -> str | None:
    """What is wrong with a predicate on its own, before any input is seen; None when nothing."""
    if not where.strip():
        return "is empty; remove the key to keep every row"
    try:
        parse(where)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class RowFilter:
    """A parsed `where`, with the input columns it reads."""

    where: str

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(parse(self.where).meta.root_names()))

    def check(self, schema: pa.Schema) -> str | None:
        """What is wrong with the predicate over a shard of this schema; None when nothing."""
        import polars as pl

        missing = [c for c in self.columns if c not in schema.names]
        if missing:
            return (
                f"names column(s) {', '.join(missing)} the input lacks; "
                f"it has {', '.join(schema.names)}"
            )
        try:
            empty = pl.from_arrow(schema.empty_table().select(list(self.columns)))
            kind = empty.select(parse(self.where)).to_series().dtype
        except Exception as exc:  # a type error inside the expression, say
            return f"cannot be evaluated over the input's columns: {exc}"
        if kind not in (pl.Boolean, pl.Null):
            return f"is {kind}, not true or false; write a comparison, e.g. lang = 'en'"
        return None

    def keep(self, table: pa.Table) -> np.ndarray:
        """Positions of the window rows that pass, in order; `WhereError` when the predicate
        cannot be evaluated on these rows (a cast of a value that is not a number, say)."""
        import polars as pl

        frame = pl.from_arrow(table.select(list(self.columns))) if self.columns else None
        if frame is None or not isinstance(frame, pl.DataFrame):
            frame = pl.DataFrame({"_": np.zeros(table.num_rows, dtype=np.int8)})
        try:
            rows = frame.with_row_index("__row").filter(parse(self.where))["__row"]
        except Exception as exc:  # polars raises its own error types, whose text quotes rows
            raise WhereError(redact(str(exc))) from None
        return rows.to_numpy().astype(np.int64)

    def keep_in(self, table: pa.Table, path: str, offset: int) -> np.ndarray:
        """`keep` for rows ``offset`` on of the shard at ``path``: a predicate that cannot be
        evaluated there is the job's error (exit 2), naming the file and the rows."""
        try:
            return self.keep(table)
        except WhereError as exc:
            raise JobError(
                f"[input].where = {self.where!r} cannot be evaluated on {path} (rows "
                f"{offset}-{offset + table.num_rows}): {exc}; fix the expression (compare "
                "columns with values of their own type)"
            ) from None


class WhereError(ValueError):
    """`[input].where` failed on a window of rows; the message quotes no row's value."""


def redact(message: str) -> str:
    """An evaluation error's first line with anything that may quote a row removed: polars
    lists the offending values after "values:", quoted or bracketed, over several lines."""
    first = message.strip().splitlines()[0] if message.strip() else "cannot be evaluated"
    first = first.split(" values:", 1)[0]
    first = QUOTED.sub("...", first)
    return OPENED.split(first, 1)[0].rstrip(" :,") or "cannot be evaluated"


QUOTED = re.compile(r"\[[^\]]*\]|\"[^\"]*\"|'[^']*'|`[^`]*`")  # closed on the line
OPENED = re.compile(r"[\[\"'`]")  # an opener whose close is on another line
