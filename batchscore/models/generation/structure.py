"""Structured generation's grammar and values: what `[generate].json_schema`, `choices` or
`regex` let a row write, and that value read back.

The grammar is llguidance's (docs/structured.md says why that engine): a JSON Schema as its own
JSON-schema grammar, choices as a Lark rule of string literals, a regex as its regex grammar.
llguidance checks a grammar without a tokenizer, so a schema it cannot satisfy ("minimum (5) is
greater than maximum (3)") or an invalid regex is a job error found by `validate`, before any
weights load. A schema whose value maps to Arrow (objects of typed properties, arrays, strings,
integers, numbers, booleans, string enums) is written as that type; any other as its JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from batchscore.errors import JobError

EXTRA = "batchscore[structured]"
# JSON as json.dumps writes it: llguidance's default lets whitespace run between any two tokens,
# and a model (a random one surely) may then fill max_new_tokens with newlines. A schema's own
# "x-guidance" settings win.
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KEY = "[generate]"


def engine() -> Any:
    """The llguidance module, or a `JobError` naming the extra that installs it."""
    try:
        import llguidance
    except ImportError as exc:
        raise JobError(
            f"{KEY}: structured generation needs llguidance; pip install '{EXTRA}'"
        ) from exc
    return llguidance


@dataclass(frozen=True)
class Structure:
    """One structure key of a `[generate]` section: ``key`` names it, ``value`` is the job's."""

    key: str
    value: Any

    @classmethod
    def of(cls, options: Any) -> Structure | None:
        """The section's structure key, if it sets one (`GenerateConfig.structure`)."""
        found = getattr(options, "structure", None)
        return cls(*found) if found is not None else None

    def grammar(self) -> str:
        """The llguidance grammar (its JSON text) for this key; a `JobError` naming the key
        when llguidance cannot read or satisfy it (no tokenizer needed)."""
        llguidance = engine()
        matcher = llguidance.LLMatcher
        try:
            if self.key == "json_schema":
                grammar = matcher.grammar_from_json_schema(self.value, COMPACT)
            elif self.key == "choices":
                rule = " | ".join(json.dumps(choice) for choice in self.value)
                grammar = matcher.grammar_from_lark(f"start: {rule}")
            else:
                grammar = matcher.grammar_from_regex(self.value)
        except (ValueError, TypeError) as exc:
            raise JobError(f"{KEY}.{self.key}: {exc}") from exc
        problem = matcher.validate_grammar(grammar)
        if problem:
            raise JobError(f"{KEY}.{self.key}: {problem.strip()}")
        return grammar

    def arrow_type(self) -> pa.DataType:
        """The `parsed` column's type: the schema's Arrow type where it has one, else a string
        (the value's JSON text for a schema; the text itself for choices and a regex)."""
        if self.key != "json_schema":
            return pa.string()
        return arrow_type(self.value) or pa.string()

    def parse(self, texts: list[str | None]) -> tuple[pa.Array, dict[int, str]]:
        """Each complete value (None where a row has none) as the `parsed` column holds it, and
        why each row whose text is no such value is not: text that is not JSON after decoding,
        or a value outside its Arrow type (an integer past int64: a schema without bounds lets
        a model write one). Never an exception for the window: a row's problem is its own."""
        kind = self.arrow_type()
        if self.key != "json_schema":
            return pa.array(texts, pa.string()), {}
        values: list[Any] = []
        failed: dict[int, str] = {}
        for row, text in enumerate(texts):
            try:
                value = None if text is None else json.loads(text)
            except ValueError as exc:
                failed[row] = f"{KEY}.json_schema: the value is not JSON once decoded: {exc}"
                value = None
            values.append(json.dumps(value) if kind == pa.string() and value is not None else value)
        try:
            return pa.array(values, kind), failed
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass  # some row's value does not fit: find it, keep the others
        for row, value in enumerate(values):
            try:
                pa.array([value], kind)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                failed[row] = f"{KEY}.json_schema: the value does not fit {kind}: {exc}"
                values[row] = None
        return pa.array(values, kind), failed


SCALARS = {
    "string": pa.string(),
    "integer": pa.int64(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
}


def arrow_type(schema: Any) -> pa.DataType | None:
    """The Arrow type every value of ``schema`` fits, or None when there is none (a union of
    types, an open object's unknown keys, a reference, a nested combinator).

    An object maps to a struct of its declared properties; properties it may leave out or set
    to null are nullable fields, as every struct field is. An object that allows further keys
    (``additionalProperties`` not false) keeps its declared ones in the struct: the whole value
    is still the row's `generated` text.
    """
    if not isinstance(schema, dict) or any(k in schema for k in ("$ref", "anyOf", "oneOf")):
        return None
    if "enum" in schema or "const" in schema:
        options = schema.get("enum", [schema.get("const")])
        return pa.string() if all(isinstance(o, str) for o in options) else None
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: nullable, as every column is
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "array":
        item = arrow_type(schema.get("items"))
        return pa.list_(item) if item is not None else None
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return None
        fields = [(name, arrow_type(sub)) for name, sub in properties.items()]
        if any(t is None for _, t in fields):
            return None
        return pa.struct(fields)
    return None
