"""Prompt templates: `str.format` fields name input columns, e.g. ``"Question: {question}"``.

Checked when the job file loads (`template_problem`), before any model is imported; rendered
per row by `batchscore.models.text.inputs`. Only plain ``{column}`` fields are allowed: a field is
its column's text as it is. Attribute or index access (``{a.b}``, ``{a[0]}``) would let a
template reach into Python objects; a format spec (``{a:.2f}``, ``{a:d}``) fails on a string
at the first row, or pads and cuts the text (``{a:>9}``, ``{a:.5}``); a conversion
(``{a!r}``) quotes and escapes it. Braces meant as text are written ``{{`` and ``}}``.
"""

from __future__ import annotations

import string


def template_columns(template: str) -> tuple[str, ...]:
    """The columns a template reads, in order of first use; ValueError for a bad template."""
    columns: list[str] = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        marks = (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        shown = f"{{{name}{marks}}}"
        if not name or not name.isidentifier():
            raise ValueError(f"{shown} is not a column field; write {{column_name}}")
        if conversion or spec:
            kind = "a conversion" if conversion else "a format spec"
            raise ValueError(
                f"{shown}: {kind} does not apply to a column's text, which a field holds as "
                f"it is; write {{{name}}} (and {{{{ or }}}} for a literal brace)"
            )
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
