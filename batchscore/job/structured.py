"""Structured generation's keys as a job gives them (`[generate].json_schema`, `choices`,
`regex`): their checks that need no grammar engine, a JSON Schema read from a file, and an
OpenAI ``response_format`` turned into `[generate]` keys.

Both are plain data work, with no grammar engine: whether a schema can be satisfied is checked
against the engine with the model's files (`models/generation/structure.py`), still before any
weights load.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from batchscore.errors import JobError
from batchscore.files import Refused, read_shared

MAX_SCHEMA_BYTES = 1 << 20  # a JSON Schema file: a schema, not a data set
MAX_CHOICES = 1 << 12  # [generate].choices: a label set, not a vocabulary
STRUCTURE_KEYS = ("json_schema", "choices", "regex")


def structure_problems(options: Any) -> list[str]:
    """The structure keys' problems that need no grammar engine: one key at most, a choice list
    that is not empty, no empty or repeated choice, a non-empty regex, and greedy or sampled
    decoding (a constraint follows one row's tokens; beams would need one per hypothesis)."""
    given = [key for key in STRUCTURE_KEYS if getattr(options, key) is not None]
    found = []
    if len(given) > 1:
        found.append(f"{'/'.join(given)}: set one of them, not {len(given)}")
    choices = options.choices
    if choices is not None:
        if not choices:
            found.append("choices: an empty list leaves the model nothing to write")
        elif len(choices) > MAX_CHOICES:
            found.append(f"choices: at most {MAX_CHOICES} strings, got {len(choices)}")
        if any(not c for c in choices):
            found.append("choices: an empty string is no choice")
        twice = sorted(c for c, n in Counter(choices).items() if n > 1)
        if twice:
            found.append(f"choices: {twice[0]!r} is listed twice")
    if options.regex is not None and not options.regex:
        found.append("regex: an empty pattern matches only the empty string")
    if given and options.num_beams > 1:
        found.append(
            f"{given[0]}: structured generation decodes greedily or samples; set num_beams = 1"
        )
    return found


def read_schema(base: Path, path: str, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The JSON Schema in the file ``path`` (relative to the job's folder ``base``), as a table;
    None after appending a problem (prefixed by ``where``) when it cannot be read or is not a
    JSON object. The schema itself, not its path, goes on to the fingerprint, so editing the
    file changes the job."""
    file = (base / Path(path).expanduser()).resolve()
    try:
        data = read_shared(file, MAX_SCHEMA_BYTES)
    except Refused as exc:
        problems.append(f"{where}: {exc}")
        return None
    except OSError as exc:
        problems.append(f"{where}: {file}: {exc.strerror or exc}")
        return None
    if data is None:
        problems.append(f"{where}: {file}: no such file (a schema is a table or a JSON file)")
        return None
    try:
        schema = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{where}: {file}: not JSON: {exc}")
        return None
    if not isinstance(schema, dict):
        problems.append(f"{where}: {file}: a JSON Schema is an object, got {type(schema).__name__}")
        return None
    return schema


def from_response_format(response_format: Any) -> dict[str, Any]:
    """The `[generate]` keys that an OpenAI request's ``response_format`` asks for.

    ``{"type": "json_schema", "json_schema": {"schema": {...}}}`` gives ``json_schema`` (the
    schema; ``name`` and ``strict`` change nothing here: the output always follows the schema),
    ``{"type": "json_object"}`` a schema of any JSON object, and ``{"type": "text"}`` or None
    no key at all. Anything else is a `JobError` naming what is wrong, which a batch-file reader
    turns into that request's error.
    """
    if response_format is None:
        return {}
    if not isinstance(response_format, dict):
        raise JobError(f"response_format: expected an object, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": {"type": "object"}}
    if kind != "json_schema":
        raise JobError(
            f"response_format.type: expected text, json_object or json_schema, got {kind!r}"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise JobError("response_format.json_schema: expected an object with a schema")
    schema = spec.get("schema", {"type": "object"})  # OpenAI's own default: any object
    if not isinstance(schema, dict):
        raise JobError(
            f"response_format.json_schema.schema: expected an object, got {type(schema).__name__}"
        )
    return {"json_schema": schema}
