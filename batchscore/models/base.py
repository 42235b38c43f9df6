"""What every task adapter shares: the `Encoded` window and the `Task` protocol the stages call.

The pipeline knows nothing else of a model. A task reads its input columns from a window,
encodes the rows it can (naming the others in ``errors``), scores batches of units, turns the
results back into output columns, one value per encoded row, and says how to compare two
scorings of the same rows (the quality gate's measure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from batchscore.job.sections import QualityConfig
from batchscore.models.agreement import Agreement, Columns


@dataclass
class Encoded:
    """One window, ready for the model.

    Units are what the model scores: a row, or one sentence of a row. ``lengths[u]`` is unit
    ``u``'s token count and ``owners[u]`` the index into ``rows`` of the row it belongs to.
    ``rows`` are the window rows that encoded; every other row is in ``errors`` (window row ->
    message) and gets no output. ``reserve`` is how many tokens each unit grows by while it is
    scored (generated tokens), which the batch budget must also hold. ``type_ids`` are a text
    pair's segments, per unit. ``chunked`` counts the texts cut into windows (several units for
    one text, with `[model].long_text = "chunk"`) and ``windows`` those texts' units.
    """

    lengths: np.ndarray
    owners: np.ndarray
    rows: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)
    ids: list[np.ndarray] | None = None
    truncated: int = 0
    reserve: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    type_ids: list[np.ndarray] | None = None
    chunked: int = 0
    windows: int = 0


class Task(Protocol):
    """A task adapter. ``columns`` are its output fields; ``inputs`` the input columns it reads."""

    columns: list[pa.Field]
    inputs: tuple[str, ...]
    bucketing: bool  # False: batches by max_rows only (inputs have no length to sort by)

    def encode(self, table: pa.Table) -> Encoded: ...

    def forward(self, encoded: Encoded, batch: np.ndarray) -> Any: ...

    def finish(self, encoded: Encoded, results: Any) -> dict[str, pa.Array]: ...

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        """How far ``candidate`` outputs (another precision's) are from fp32's ``reference``."""
        ...


def text_rows(table: pa.Table, column: str) -> tuple[list[str], np.ndarray, dict[int, str]]:
    """The usable texts of ``column``, the rows they come from, and an error per other row.

    A null or blank text is an error rather than an empty input: scoring it would write a
    confident-looking result for a row that holds nothing.
    """
    values = table.column(column).to_pylist()
    errors = {
        i: f"column {column!r}: text is {'null' if text is None else 'empty'}"
        for i, text in enumerate(values)
        if text is None or not text.strip()
    }
    rows = [i for i in range(len(values)) if i not in errors]
    return [values[i] for i in rows], np.asarray(rows, dtype=np.int64), errors


def pair_rows(
    table: pa.Table, column: str, pair: str
) -> tuple[list[str], list[str], np.ndarray, dict[int, str]]:
    """Like `text_rows`, for rows read as a pair of texts: both must hold text."""
    _, _, errors = text_rows(table, column)
    _, _, pair_errors = text_rows(table, pair)
    errors = {**pair_errors, **errors}
    rows = [i for i in range(table.num_rows) if i not in errors]
    firsts, seconds = table.column(column).to_pylist(), table.column(pair).to_pylist()
    return [firsts[i] for i in rows], [seconds[i] for i in rows], np.asarray(rows, np.int64), errors
