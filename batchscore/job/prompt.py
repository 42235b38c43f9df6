"""Prompt templates: `str.format` fields name input columns, e.g. ``"Question: {question}"``.

Kept free of torch so the job file can check a template (`template_problem`) at load time,
before any model is imported. Only plain ``{column}`` fields are allowed: attribute or index
access (``{a.b}``, ``{a[0]}``) would let a template reach into Python objects.
"""

from __future__ import annotations

import string

import numpy as np
import pyarrow as pa


def template_columns(template: str) -> tuple[str, ...]:
    """The columns a template reads, in order of first use; ValueError for a bad template."""
    columns: list[str] = []
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if not name or not name.isidentifier():
            shown = "{" + name + "}"
            raise ValueError(f"{shown} is not a column field; write {{column_name}}")
        if spec and "{" in spec:
            raise ValueError(f"{{{name}:{spec}}}: nested fields are not supported")
        columns.append(name)
    if not columns:
        raise ValueError("names no input column; write e.g. {text}")
    return tuple(dict.fromkeys(columns))


def template_problem(template: str | None) -> str | None:
    """Why a template is unusable, or None when it is fine (or absent)."""
    if template is None:
        return None
    try:
        template_columns(template)
    except ValueError as exc:
        return str(exc)
    return None


class Prompt:
    """Renders one prompt per row: the template over its columns, or one text column as is."""

    def __init__(self, template: str | None, text_column: str) -> None:
        self.template = template
        self.columns = template_columns(template) if template else (text_column,)

    def render(self, table: pa.Table) -> tuple[list[str], np.ndarray, dict[int, str]]:
        """Prompts of the rows with no null column, those rows, and an error per other row."""
        values = {c: table.column(c).to_pylist() for c in self.columns}
        errors: dict[int, str] = {}
        for column in self.columns:
            for i, value in enumerate(values[column]):
                if value is None and i not in errors:
                    errors[i] = f"column {column!r}: text is null"
        rows = [i for i in range(table.num_rows) if i not in errors]
        if self.template is None:
            texts = [values[self.columns[0]][i] for i in rows]
        else:
            fields = [{c: values[c][i] for c in self.columns} for i in rows]
            texts = [self.template.format_map(f) for f in fields]
        return texts, np.asarray(rows, dtype=np.int64), errors
