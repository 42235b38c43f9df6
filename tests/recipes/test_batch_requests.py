"""OpenAI Batch request lines read: served requests, and every bad line refused on its own."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.recipes.batch_requests import (
    ChatRequest,
    Embeddings,
    Refused,
    read_requests,
)

MODELS = {"m"}


def line(custom_id: object = "r1", url: str = "/v1/embeddings", **body: object) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
    return json.dumps(item).encode()


def test_the_documented_shapes_are_served():
    """As OpenAI's batch guide writes them: a chat request and an embeddings request."""
    chat = line(
        "request-1",
        "/v1/chat/completions",
        model="m",
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "Hello world!"}]},
        ],
        max_tokens=1000,
        temperature=0,
        stop="\n\n",
        response_format={"type": "text"},
    )
    embed = line("request-2", input=["a", "b"], dimensions=8, encoding_format="base64")
    first, second = read_requests([chat, b"", embed], MODELS)
    assert isinstance(first, ChatRequest) and first.line == 0
    assert json.loads(first.messages)[1] == {"role": "user", "content": "Hello world!"}
    assert first.decoding.max_new_tokens == 1000 and first.decoding.stop == ("\n\n",)
    assert first.decoding.temperature == 0
    assert second == Embeddings(2, "request-2", ("a", "b"), 8, "base64")


@pytest.mark.parametrize(
    ("raw", "code", "custom_id"),
    [
        (b"{not json", "invalid_json", None),
        (b"[1, 2]", "invalid_request", None),
        (line(None, input="x"), "invalid_request", None),
        (line(url="/v1/completions", prompt="x"), "invalid_url", "r1"),
        (line(model="gpt-4o", input="x"), "model_mismatch", "r1"),
        (line(), "invalid_request", "r1"),  # no input
        (line(input=[1, 2, 3]), "invalid_request", "r1"),  # token ids
        (line(input="x", encoding_format="int8"), "invalid_request", "r1"),
        (line(input="x", dimensions=0), "invalid_request", "r1"),
        (line(url="/v1/chat/completions"), "invalid_request", "r1"),  # no messages
        (
            line(url="/v1/chat/completions", messages=[{"role": "user", "content": "x"}], n=2),
            "invalid_request",
            "r1",
        ),
        (
            line(
                url="/v1/chat/completions",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=0,
            ),
            "invalid_request",
            "r1",
        ),
        (
            line(url="/v1/chat/completions", messages=[{"role": "tool", "content": "x"}]),
            "invalid_request",
            "r1",
        ),
        (
            line(
                url="/v1/chat/completions",
                messages=[{"role": "user", "content": "x"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "integer", "minimum": 5, "maximum": 3}},
                },
            ),
            "invalid_response_format",
            "r1",
        ),
        (
            line(
                url="/v1/chat/completions",
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "grammar"},
            ),
            "invalid_response_format",
            "r1",
        ),
    ],
)
def test_a_bad_line_is_refused_for_its_custom_id(raw: bytes, code: str, custom_id: str | None):
    (refused, after) = read_requests([raw, line("next", input="fine")], MODELS)
    assert isinstance(refused, Refused), refused
    assert (refused.code, refused.custom_id, refused.line) == (code, custom_id, 0)
    assert isinstance(after, Embeddings)  # the bad line stops nothing


def test_a_repeated_custom_id_is_refused_after_its_first_line():
    first, again = read_requests([line("x", input="a"), line("x", input="b")], MODELS)
    assert isinstance(first, Embeddings)
    assert isinstance(again, Refused) and again.code == "duplicate_custom_id"
    assert "line 1" in again.message


def test_a_response_format_becomes_the_decodings_schema():
    """json_schema and json_object hold the answer to a schema (requests with equal schemas
    share a decoding, so a job); text or none leaves it free; an unsatisfiable schema is said
    in the request's own terms."""
    user = [{"role": "user", "content": "x"}]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    given = [
        {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}},
        {"type": "json_schema", "json_schema": {"schema": dict(reversed(schema.items()))}},
        {"type": "json_object"},
        {"type": "text"},
        None,
    ]
    raw = [
        line(f"r{i}", "/v1/chat/completions", messages=user, response_format=f)
        for i, f in enumerate(given)
    ]
    read = read_requests(raw, MODELS)
    assert all(isinstance(r, ChatRequest) for r in read)
    first, second, any_object, text, none = (r.decoding for r in read)
    assert json.loads(first.schema) == schema and first == second
    assert json.loads(any_object.schema) == {"type": "object"}
    assert text.schema is None and none.schema is None and text == none
    bad = {
        "type": "json_schema",
        "json_schema": {"schema": {"type": "string", "minLength": 3, "maxLength": 1}},
    }
    (refused,) = read_requests(
        [line("b", "/v1/chat/completions", messages=user, response_format=bad)], MODELS
    )
    assert isinstance(refused, Refused) and refused.code == "invalid_response_format"
    assert refused.message.startswith("body.response_format.json_schema: ")


# text as producers write it: lone surrogates included (JSON escapes them: "\ud83d")
TEXT = st.text(st.characters(categories=["Cs", "L", "N", "P", "Zs", "So"]), max_size=5)
LINES = st.one_of(
    st.binary(max_size=40),
    st.builds(line, st.sampled_from(["a", "b", "c", None, 3, "\udc00"]), input=TEXT),
    st.builds(
        lambda cid, text: line(
            cid, "/v1/chat/completions", messages=[{"role": "user", "content": text}]
        ),
        st.sampled_from(["a", "b", "d"]),
        TEXT,
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(LINES, max_size=12))
def test_every_line_is_one_request_or_one_refusal(lines: list[bytes]):
    """Whatever the file holds: one entry per non-blank line, in order, never an exception,
    the custom_ids served are unique, and each custom_id belongs to one line (its first)."""
    lines = [raw.replace(b"\n", b" ").replace(b"\r", b" ") for raw in lines]
    found = read_requests(lines, MODELS)
    assert [r.line for r in found] == [i for i, raw in enumerate(lines) if raw.strip()]
    served = [r.custom_id for r in found if not isinstance(r, Refused)]
    assert len(served) == len(set(served))
    owners = [
        r.custom_id
        for r in found
        if r.custom_id is not None and getattr(r, "code", None) != "duplicate_custom_id"
    ]
    assert len(owners) == len(set(owners))  # a custom_id belongs to one line, served or not
    for request in found:  # what is served is text: Parquet, the tokenizer and JSON take it
        if isinstance(request, Embeddings):
            "".join(request.texts).encode("utf-8")
        elif isinstance(request, ChatRequest):
            json.loads(request.messages)[0]["content"].encode("utf-8")


def test_a_custom_id_is_kept_by_its_first_line_even_when_that_line_is_refused():
    """OpenAI requires each custom_id once per file. The first line that names one keeps it,
    served or refused: every later line with it is refused as a duplicate, so a refused line
    and a served line never answer the same custom_id."""
    bad, good, again = read_requests(
        [line("a", input=""), line("a", input="fine"), line("a", input="also fine")], MODELS
    )
    assert isinstance(bad, Refused) and bad.code == "invalid_request"
    for later in (good, again):
        assert isinstance(later, Refused) and later.code == "duplicate_custom_id"
        assert later.custom_id == "a" and "line 1" in later.message


CUT = "cut \ud83d emoji"  # a JavaScript string whose emoji lost its second half (JSON: "\ud83d")
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("raw", "where", "custom_id"),
    [
        (line(input=CUT), "body.input", "r1"),
        (line(input=["fine", CUT]), "body.input[1]", "r1"),
        (
            line(url=CHAT, messages=[{"role": "user", "content": CUT}]),
            "body.messages[0].content",
            "r1",
        ),
        (
            line(url=CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": CUT}]}]),
            "body.messages[0].content[0].text",
            "r1",
        ),
        (line(url=CHAT, messages=USER, stop=[CUT]), "body.stop[0]", "r1"),
        (
            line(
                url=CHAT,
                messages=USER,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"schema": {"enum": [CUT]}},
                },
            ),
            "body.response_format.json_schema.schema.enum[0]",
            "r1",
        ),
        (line(model=CUT, input="x"), "body.model", "r1"),
        (line(CUT, input="x"), "custom_id", CUT),  # echoed as sent: its producer matches it
        (line(input="x", **{CUT: 1}), "a key of body", "r1"),  # even one nobody reads
    ],
    ids=["input", "inputs", "content", "part", "stop", "schema", "model", "custom_id", "key"],
)
def test_a_lone_surrogate_is_its_lines_error(raw: bytes, where: str, custom_id: str):
    """Valid JSON, not Unicode text: a ``\\ud83d`` with no low half can be neither stored as
    UTF-8 (Parquet, the results file) nor tokenized; wherever it sits in the line, the line is
    refused alone, naming the field."""
    refused, after = read_requests([raw, line("next", input="fine")], MODELS)
    assert isinstance(refused, Refused), refused
    assert (refused.code, refused.custom_id) == ("invalid_unicode", custom_id)
    assert where in refused.message and "\\ud83d" in refused.message
    refused.message.encode("utf-8")  # the message itself is text that can be written
    assert isinstance(after, Embeddings)


def test_a_line_that_is_not_utf8_is_refused_for_its_custom_id():
    """Bytes that are not UTF-8 (a Latin-1 é): the line's error, under its custom_id when the
    rest of the line still names one; a custom_id that is itself broken cannot be named."""
    broken = line("u", input="caf__").replace(b"__", b"\xe9!")
    no_id = line("__", input="x").replace(b"__", b"\xff")
    first, second, after = read_requests([broken, no_id, line("ok", input="fine")], MODELS)
    assert isinstance(first, Refused) and (first.code, first.custom_id) == ("invalid_unicode", "u")
    assert "line 1" in first.message and "0xe9" in first.message
    assert isinstance(second, Refused) and (second.code, second.custom_id) == (
        "invalid_unicode",
        None,
    )
    assert isinstance(after, Embeddings)


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a": ' * 100_000], ids=["array", "object"])
def test_json_nested_past_the_recursion_limit_is_not_json(raw: bytes):
    """Refused as not JSON, for its own line: never a RecursionError's traceback."""
    found, after = read_requests([raw, line("next", input="fine")], MODELS)
    assert isinstance(found, Refused) and found.code == "invalid_json"
    assert "nested" in found.message and isinstance(after, Embeddings)


def test_a_deep_line_that_parses_is_read_whole():
    """Nesting the parser takes (an unread field 900 deep, a schema 400 deep) is walked
    without recursion: served, or refused by the schema's own check, never a traceback."""
    deep: object = "x"
    for _ in range(900):
        deep = [deep]
    schema: dict = {"type": "string"}
    for _ in range(400):
        schema = {"type": "array", "items": schema}
    response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
    served, constrained = read_requests(
        [
            line("a", input="x", user=deep),
            line("b", CHAT, messages=USER, response_format=response_format),
        ],
        MODELS,
    )
    assert isinstance(served, Embeddings)
    assert isinstance(constrained, ChatRequest | Refused)


def test_a_byte_order_mark_starts_a_line_not_its_json():
    """Windows tools write a UTF-8 BOM first (and ``cat`` of two such files puts one inside)."""
    bom = b"\xef\xbb\xbf"
    first, second = read_requests([bom + line("a", input="x"), bom + line("b", input="y")], MODELS)
    assert isinstance(first, Embeddings) and isinstance(second, Embeddings)


@pytest.mark.parametrize(
    "body",
    [
        {"max_completion_tokens": None, "max_tokens": 5},
        {"max_tokens": None},
        {"seed": None, "temperature": None, "top_p": None, "n": None},
        {"stop": None, "response_format": None, "model": None},
    ],
)
def test_a_null_optional_field_is_an_absent_one(body: dict):
    """JSON producers write ``null`` for a field they leave unset; OpenAI reads it as absent."""
    (found,) = read_requests([line(url=CHAT, messages=USER, **body)], MODELS)
    assert isinstance(found, ChatRequest), found
    assert found.decoding.max_new_tokens == (5 if body.get("max_tokens") == 5 else None)


def test_null_optional_embedding_fields_are_absent():
    (found,) = read_requests([line(input="x", dimensions=None, encoding_format=None)], MODELS)
    assert found == Embeddings(0, "r1", ("x",), None, "float")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"42", "invalid_request"),
        (b'"a string"', "invalid_request"),
        (b"null", "invalid_request"),
        (line(None, input="x"), "invalid_request"),
        (line(input=None), "invalid_request"),
        (line(input=" \u200b\t"), "invalid_request"),  # blank: nothing the pipeline embeds
        (line(input=["fine", "   "]), "invalid_request"),
        (line(url=CHAT, messages=None), "invalid_request"),
        (line(url=CHAT, messages=[{"role": "user", "content": None}]), "invalid_request"),
        (
            line(url=CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            "invalid_request",
        ),
        (
            line(url=CHAT, messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "invalid_request",
        ),
    ],
)
def test_null_or_wrong_required_fields_are_refused(raw: bytes, code: str):
    (found,) = read_requests([raw], MODELS)
    assert isinstance(found, Refused) and found.code == code, found
