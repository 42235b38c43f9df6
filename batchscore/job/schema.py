"""Turn a TOML table into a frozen dataclass, collecting every problem rather than the first.

The dataclass *is* the schema: field types say what a key accepts (``Literal`` lists the choices),
defaults say what is optional, and ``field(metadata={"min": ..., "max": ...})`` bounds numbers.
Keeping the schema in the type annotations means a new key is one line, and its error messages
come for free.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal

MISSING = dataclasses.MISSING


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """A ' (did you mean "x"?)' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def choices(annotation: Any) -> list[str]:
    """The words a key accepts (its ``Literal`` choices, in a union too), for a "did you mean"."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return [str(a) for a in typing.get_args(annotation) if isinstance(a, str)]
    if origin in (typing.Union, types.UnionType):
        return [word for a in typing.get_args(annotation) for word in choices(a)]
    return []


def describe(annotation: Any, *, plural: bool = False) -> str:
    """Say in words what values an annotation accepts, for error messages (``plural``: as
    the items of a list, "finite numbers" rather than "a finite number")."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        words = ", ".join(str(a) for a in typing.get_args(annotation))
        return f"values among {words}" if plural else f"one of {words}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(
            describe(a, plural=plural) for a in typing.get_args(annotation) if a is not type(None)
        )
    if origin is tuple:
        items = describe(typing.get_args(annotation)[0], plural=True)
        return f"lists of {items}" if plural else f"a list of {items}"
    if origin is dict:
        return "tables" if plural else "a table"
    words = {
        str: ("a string", "strings"),
        int: ("an integer", "integers"),
        float: ("a finite number", "finite numbers"),
        bool: ("true or false", "true or false"),
    }.get(annotation)
    if words is None:
        return getattr(annotation, "__name__", str(annotation))
    return words[plural]


LONGEST_SHOWN = 60  # characters of a value echoed in a message: a list of 768 numbers is not


def show(value: Any) -> str:
    """Render a user's value the way they wrote it in TOML (a long one cut short)."""
    if isinstance(value, str):
        text = f'"{value}"'
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = repr(value)
    return text if len(text) <= LONGEST_SHOWN else f"{text[: LONGEST_SHOWN - 4]} ..."


def first_bad(value: Any, annotation: Any) -> str | None:
    """Where in a list ``value`` the first item ``annotation``'s items refuse sits, and that
    item ("[1][5] is nan"); None when the list is not the problem (it is no list at all)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        lists = [a for a in typing.get_args(annotation) if typing.get_origin(a) is tuple]
        return first_bad(value, lists[0]) if len(lists) == 1 else None
    if typing.get_origin(annotation) is not tuple or not isinstance(value, list):
        return None
    item = typing.get_args(annotation)[0]
    for index, element in enumerate(value):
        if not coerce(element, item)[0]:
            inner = first_bad(element, item)
            return f"[{index}]{inner}" if inner else f"[{index}] is {show(element)}"
    return None


def coerce(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Check ``value`` against ``annotation``; return (ok, value converted to the field's type)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation), value
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            if option is not type(None):
                ok, converted = coerce(value, option)
                if ok:
                    return True, converted
        return False, value
    if origin is tuple:
        item = typing.get_args(annotation)[0]
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return False, value
        converted = [coerce(v, item) for v in items]
        return all(ok for ok, _ in converted), tuple(v for _, v in converted)
    if origin is dict:  # a TOML table passed through as is (e.g. a factory's arguments)
        return isinstance(value, dict), value
    if annotation is float:  # nan and inf are never a threshold, a budget or a share
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
        return ok, float(value) if ok else value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    return isinstance(value, annotation), value


def build(cls: type, table: dict[str, Any], where: str, problems: list[str], **extra: Any) -> Any:
    """Build dataclass ``cls`` from ``table``; append one message per problem to ``problems``.

    ``where`` prefixes each message (e.g. ``jobs/x.toml: [model]``). ``extra`` supplies fields that
    do not come from the table (resolved paths, say). Returns None when a required key is missing
    or a value is unusable, so callers never see a half-valid section.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in extra}
    values: dict[str, Any] = dict(extra)
    failed = False
    for key, value in table.items():
        if key not in fields:
            problems.append(f"{where}.{key}: unknown key{did_you_mean(key, fields)}")
            failed = True
            continue
        ok, converted = coerce(value, hints[key])
        low, high = fields[key].metadata.get("min"), fields[key].metadata.get("max")
        if not isinstance(converted, int | float) or isinstance(converted, bool):
            low = high = None  # bounds apply to numbers, not to a choice such as "auto"
        if ok and low is not None and converted < low:
            problems.append(f"{where}.{key}: must be at least {low}, got {show(value)}")
            failed = True
        elif ok and high is not None and converted > high:
            problems.append(f"{where}.{key}: must be at most {high}, got {show(value)}")
            failed = True
        elif not ok:
            hint = did_you_mean(value, choices(hints[key])) if isinstance(value, str) else ""
            place = first_bad(value, hints[key])
            got = f"; {place}" if place else f", got {show(value)}{hint}"
            problems.append(f"{where}.{key}: expected {describe(hints[key])}{got}")
            failed = True
        else:
            values[key] = converted
    for name, f in fields.items():
        given = name in table  # a key given with a bad value has its message already
        if not given and f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{where}.{name}: required key is missing")
            failed = True
    return None if failed else cls(**values)
