"""Prompt templates: `str.format` fields name input columns, e.g. ``"Question: {question}"``.

Checked when the job file loads (`template_problem`), before any model is imported; rendered
per row by `batchscore.models.prompt`. Only plain ``{column}`` fields are allowed: attribute or
index access (``{a.b}``, ``{a[0]}``) would let a template reach into Python objects.
"""

from __future__ import annotations

import string


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
