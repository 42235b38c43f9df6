"""Rendering prompts: one per row, a template over input columns or one text column as is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batchscore.job.prompt import template_columns
from batchscore.models.base import text_values


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
