"""A task's text inputs, read from a window: one text column, a pair of them, or a prompt
rendered over columns, each row's text as a Python string, and an error naming the column for
every row that holds no usable text."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from batchscore.job.prompt import template_columns

# Characters that carry no text: whitespace, controls (NUL), and the invisible format characters
# a copy-paste leaves behind (zero-width spaces and joiners, BOM, soft hyphen, bidi marks).
BLANK = re.compile(r"[\s\x00-\x1f\x7f\u00ad\u180e\u200b-\u200f\u2028-\u202f\u2060-\u206f\ufeff]*")


def text_values(
    column: pa.ChunkedArray | pa.Array, name: str, *, blank_ok: bool = False
) -> tuple[list[str | None], dict[int, str]]:
    """A text column as Python strings, whatever its Arrow layout (string, large_string,
    string_view, dictionary-encoded, chunked), and an error per row that holds no usable text:
    null, not valid UTF-8 (surrogates included), or (unless ``blank_ok``) nothing but invisible
    characters. Such a row gets None."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    values: list[str | None] = []
    errors: dict[int, str] = {}
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_decode()
        for raw in chunk.cast(pa.large_binary()).to_pylist():  # no UTF-8 decoding in Arrow
            row = len(values)
            if raw is None:
                errors[row] = f"column {name!r}: text is null"
                values.append(None)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors[row] = f"column {name!r}: not valid UTF-8 (byte {exc.start})"
                values.append(None)
                continue
            if not blank_ok and BLANK.fullmatch(text):
                errors[row] = f"column {name!r}: text is empty"
                text = None
            values.append(text)
    return values, errors


def text_rows(table: pa.Table, column: str) -> tuple[list[str], np.ndarray, dict[int, str]]:
    """The usable texts of ``column``, the rows they come from, and an error per other row.

    A null, undecodable or blank text is an error rather than an empty input: scoring it would
    write a confident-looking result for a row that holds nothing.
    """
    values, errors = text_values(table.column(column), column)
    rows = [i for i in range(len(values)) if i not in errors]
    return [values[i] for i in rows], np.asarray(rows, dtype=np.int64), errors


def pair_rows(
    table: pa.Table, column: str, pair: str
) -> tuple[list[str], list[str], np.ndarray, dict[int, str]]:
    """Like `text_rows`, for rows read as a pair of texts: both must hold text."""
    firsts, errors = text_values(table.column(column), column)
    seconds, pair_errors = text_values(table.column(pair), pair)
    errors = {**pair_errors, **errors}
    rows = [i for i in range(table.num_rows) if i not in errors]
    return [firsts[i] for i in rows], [seconds[i] for i in rows], np.asarray(rows, np.int64), errors


class Prompt:
    """Renders one prompt per row: the template over its columns, or one text column as is."""

    def __init__(self, template: str | None, text_column: str) -> None:
        self.template = template
        self.columns = template_columns(template) if template else (text_column,)

    def render(self, table: pa.Table) -> tuple[list[str], np.ndarray, dict[int, str]]:
        """Prompts of the rows with no null column, those rows, and an error per other row."""
        values: dict[str, list[str | None]] = {}
        errors: dict[int, str] = {}
        for column in self.columns:
            values[column], problems = text_values(table.column(column), column, blank_ok=True)
            for i, message in problems.items():
                errors.setdefault(i, message)
        rows = [i for i in range(table.num_rows) if i not in errors]
        if self.template is None:
            texts = [values[self.columns[0]][i] for i in rows]
        else:
            fields = [{c: values[c][i] for c in self.columns} for i in rows]
            texts = [self.template.format_map(f) for f in fields]
        return texts, np.asarray(rows, dtype=np.int64), errors
