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


LINES = st.one_of(
    st.binary(max_size=40),
    st.builds(line, st.sampled_from(["a", "b", "c", None, 3]), input=st.text(max_size=5)),
    st.builds(
        lambda cid, text: line(
            cid, "/v1/chat/completions", messages=[{"role": "user", "content": text}]
        ),
        st.sampled_from(["a", "b", "d"]),
        st.text(max_size=5),
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(LINES, max_size=12))
def test_every_line_is_one_request_or_one_refusal(lines: list[bytes]):
    """Whatever the file holds: one entry per non-blank line, in order, never an exception,
    and the custom_ids served are unique."""
    lines = [raw.replace(b"\n", b" ").replace(b"\r", b" ") for raw in lines]
    found = read_requests(lines, MODELS)
    assert [r.line for r in found] == [i for i, raw in enumerate(lines) if raw.strip()]
    served = [r.custom_id for r in found if not isinstance(r, Refused)]
    assert len(served) == len(set(served))
