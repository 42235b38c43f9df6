"""Structured generation's keys in a job file: one of `[generate].json_schema`, `choices` and
`regex`, each checked before any weights load, every problem naming its key; a schema file read
relative to the job; an OpenAI ``response_format`` turned into the same keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.job.structured import from_response_format
from tests.conftest import write_job

SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"]}


def generate_job(folder: Path, **section) -> Path:
    """A generate job in ``folder`` with these `[generate]` keys (its model is never read)."""
    return write_job(
        folder / "job.toml",
        input={"path": "in"},
        model={"task": "generate", "path": "model"},
        output={"path": "out"},
        generate=section,
    )


@pytest.mark.parametrize(
    "section, said",
    [
        ({"choices": ["a"], "regex": "a"}, r"\[generate\].choices/regex: set one of them, not 2"),
        (
            {"json_schema": SCHEMA, "choices": ["a"], "regex": "a"},
            r"\[generate\].json_schema/choices/regex: set one of them, not 3",
        ),
        ({"choices": []}, r"\[generate\].choices: an empty list leaves the model nothing"),
        ({"choices": ["a", ""]}, r"\[generate\].choices: an empty string is no choice"),
        ({"choices": ["a", "b", "a"]}, r"\[generate\].choices: 'a' is listed twice"),
        ({"choices": "a"}, None),  # one string is a list of one, as for stop
        ({"regex": ""}, r"\[generate\].regex: an empty pattern"),
        ({"choices": ["a"], "num_beams": 2}, r"\[generate\].choices: .* set num_beams = 1"),
        ({"json_schema": 3}, r"\[generate\].json_schema: expected a table or a string"),
        ({"json_schema": "none.json"}, r"\[generate\].json_schema: .*none.json: no such file"),
    ],
)
def test_structure_keys_are_checked_when_the_job_loads(tmp_path, section, said):
    path = generate_job(tmp_path, **section)
    if said is None:
        assert load_job(path).options.choices == ("a",)
        return
    with pytest.raises(JobError, match=said):
        load_job(path)


def test_a_schema_file_is_read_relative_to_the_job(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "answer.json").write_text(json.dumps(SCHEMA))
    job = load_job(generate_job(tmp_path, json_schema="schemas/answer.json"))
    assert job.options.json_schema == SCHEMA
    assert job.options.structure == ("json_schema", SCHEMA)
    (tmp_path / "schemas" / "list.json").write_text("[1, 2]")
    (tmp_path / "schemas" / "bad.json").write_text("{not json")
    for name, said in [("list.json", "a JSON Schema is an object"), ("bad.json", "not JSON")]:
        with pytest.raises(JobError, match=rf"\[generate\].json_schema: .*{name}: {said}"):
            load_job(generate_job(tmp_path, json_schema=f"schemas/{name}"))


@pytest.mark.parametrize(
    "response_format, keys",
    [
        (None, {}),
        ({"type": "text"}, {}),
        ({"type": "json_object"}, {"json_schema": {"type": "object"}}),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": SCHEMA}},
            {"json_schema": SCHEMA},
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x"}},
            {"json_schema": {"type": "object"}},
        ),
    ],
)
def test_an_openai_response_format_becomes_generate_keys(response_format, keys):
    assert from_response_format(response_format) == keys


@pytest.mark.parametrize(
    "response_format, said",
    [
        ("json", "response_format: expected an object"),
        ({"type": "xml"}, "response_format.type: expected text, json_object or json_schema"),
        ({"type": "json_schema"}, "response_format.json_schema: expected an object"),
        (
            {"type": "json_schema", "json_schema": {"schema": []}},
            "response_format.json_schema.schema: expected an object",
        ),
    ],
)
def test_a_bad_response_format_is_a_job_error_naming_what(response_format, said):
    with pytest.raises(JobError, match=said):
        from_response_format(response_format)


def test_response_format_keys_load_as_a_job(tmp_path: Path):
    """What `from_response_format` returns is a `[generate]` section's keys as they are."""
    keys = from_response_format({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    job = load_job(generate_job(tmp_path, **keys))
    assert job.options.structure == ("json_schema", SCHEMA)
