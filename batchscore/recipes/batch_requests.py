"""OpenAI Batch request files read: one JSON object a line, each a request or why it is refused.

A line is ``{"custom_id", "method": "POST", "url", "body"}`` (OpenAI's batch input format, as
vLLM's ``run-batch`` reads it). `/v1/embeddings` and `/v1/chat/completions` are served; every
line that cannot be served (not JSON, another url, another model, a missing or wrong field, a
``custom_id`` seen before) becomes a `Refused` for its own line and never stops the others.
Pure: text in, requests out, so every refusal is tested without a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from batchscore.errors import JobError
from batchscore.job.decoding import MAX_STOP_CHARS
from batchscore.job.sections import MAX_NEW_TOKENS
from batchscore.job.structured import from_response_format
from batchscore.models.generation.structure import Structure

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
URLS = (EMBEDDINGS, CHAT)
MAX_STOPS = 4  # OpenAI's own limit on `stop`
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class Refused:
    """A line that cannot be served: an error line for its ``custom_id`` (None when unknown)."""

    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass(frozen=True)
class Embeddings:
    """An `/v1/embeddings` request: its texts, and how its vectors are written."""

    line: int
    custom_id: str
    texts: tuple[str, ...]
    dimensions: int | None
    encoding_format: str  # "float" | "base64"


@dataclass(frozen=True)
class Decoding:
    """How a chat request decodes: requests that share these share one generate job."""

    max_new_tokens: int | None  # None: the job's default
    stop: tuple[str, ...]
    temperature: float  # 0: greedy
    top_p: float
    seed: int
    schema: str | None = None  # response_format's JSON Schema (its JSON text): the answer's shape


@dataclass(frozen=True)
class ChatRequest:
    """A `/v1/chat/completions` request: its messages (JSON, role and text content only)."""

    line: int
    custom_id: str
    messages: str
    decoding: Decoding


Request = Refused | Embeddings | ChatRequest


class Bad(ValueError):
    """Why a request's body cannot be served, with the OpenAI error code to report."""

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code


def read_requests(lines: list[bytes], models: set[str]) -> list[Request]:
    """Every non-blank line of a request file as a request or a refusal, in file order.

    ``models``: the names a body's ``model`` may give (the model served); a body without one
    is served too. A repeated ``custom_id`` is refused on every line after its first.
    """
    found: list[Request] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        request = read_line(number, raw, models)
        if not isinstance(request, Refused) and request.custom_id in seen:
            first = seen[request.custom_id]
            message = f"custom_id {request.custom_id!r} is used before, on line {first + 1}"
            request = Refused(number, request.custom_id, "duplicate_custom_id", message)
        elif not isinstance(request, Refused):
            seen[request.custom_id] = number
        found.append(request)
    return found


def read_line(number: int, raw: bytes, models: set[str]) -> Request:
    """One line (``number`` counts from 0) as a request, or why not."""
    try:
        item = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return Refused(number, None, "invalid_json", f"line {number + 1} is not JSON: {exc}")
    custom_id = item.get("custom_id") if isinstance(item, dict) else None
    custom_id = custom_id if isinstance(custom_id, str) and custom_id else None
    try:
        if not isinstance(item, dict):
            raise Bad(f"line {number + 1}: expected a JSON object, got {type(item).__name__}")
        if custom_id is None:
            raise Bad(f"line {number + 1}: custom_id: expected a non-empty string")
        if item.get("method", "POST") != "POST":
            raise Bad(f"method: only POST is served, got {item.get('method')!r}")
        url, body = item.get("url"), item.get("body")
        if url not in URLS:
            raise Bad(f"url: {url!r} is not served; one of {', '.join(URLS)}", "invalid_url")
        if not isinstance(body, dict):
            raise Bad("body: expected a JSON object")
        model = body.get("model")
        if model is not None and model not in models:
            served = ", ".join(sorted(repr(m) for m in models))
            raise Bad(f"body.model: {model!r} is not the model served ({served})", "model_mismatch")
        if url == EMBEDDINGS:
            return embeddings(number, custom_id, body)
        return chat(number, custom_id, body)
    except Bad as exc:
        return Refused(number, custom_id, exc.code, str(exc))


def embeddings(number: int, custom_id: str, body: dict[str, Any]) -> Embeddings:
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise Bad("body.input: expected a string or a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise Bad("body.input: token ids are not served; send the texts as strings")
    if any(not t for t in texts):
        raise Bad("body.input: an input is empty")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not is_int(dimensions) or dimensions < 1):
        raise Bad(f"body.dimensions: expected a positive integer, got {dimensions!r}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise Bad(f"body.encoding_format: expected 'float' or 'base64', got {encoding!r}")
    return Embeddings(number, custom_id, tuple(texts), dimensions, encoding)


def chat(number: int, custom_id: str, body: dict[str, Any]) -> ChatRequest:
    messages = [message(m, i) for i, m in enumerate(listed(body.get("messages"), "messages"))]
    schema = response_schema(body.get("response_format"))
    if body.get("n", 1) != 1:
        raise Bad(f"body.n: one choice per request is served, got {body.get('n')!r}")
    most = body.get("max_completion_tokens", body.get("max_tokens"))
    if most is not None and (not is_int(most) or not 1 <= most <= MAX_NEW_TOKENS):
        raise Bad(f"body.max_tokens: expected an integer from 1 to {MAX_NEW_TOKENS}, got {most!r}")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS:
        raise Bad(f"body.stop: expected a string or a list of up to {MAX_STOPS} strings")
    if not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise Bad(f"body.stop: each stop is a string of 1 to {MAX_STOP_CHARS} characters")
    temperature = number_in(body, "temperature", 0.0, 0.0, 2.0)
    top_p = number_in(body, "top_p", 1.0, 0.01, 1.0)
    seed = body.get("seed", 0)
    if not is_int(seed) or seed < 0:
        raise Bad(f"body.seed: expected a non-negative integer, got {seed!r}")
    decoding = Decoding(most, tuple(stops), float(temperature), float(top_p), seed, schema)
    return ChatRequest(number, custom_id, json.dumps(messages), decoding)


def response_schema(response_format: Any) -> str | None:
    """The JSON Schema a ``response_format`` holds the answer to (its JSON text, so requests
    with equal schemas share a job), or None for plain text. The schema is checked as
    `validate` checks `[generate].json_schema` (no model needed): one the grammar engine cannot
    satisfy is this request's error, never the others'."""
    try:
        keys = from_response_format(response_format)
    except JobError as exc:
        raise Bad(f"body.{exc}", "invalid_response_format") from None
    if not keys:
        return None
    try:
        Structure("json_schema", keys["json_schema"]).grammar()
    except JobError as exc:  # "[generate].json_schema: why", said of the request's own field
        why = str(exc).partition(": ")[2]
        raise Bad(f"body.response_format.json_schema: {why}", "invalid_response_format") from None
    return json.dumps(keys["json_schema"], sort_keys=True)


def listed(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise Bad(f"body.{name}: expected a non-empty list")
    return value


def message(item: Any, index: int) -> dict[str, str]:
    """One chat message as ``{role, content}`` with text content (text parts joined)."""
    where = f"body.messages[{index}]"
    if not isinstance(item, dict) or item.get("role") not in ROLES:
        raise Bad(f"{where}: expected an object with a role among {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise Bad(f"{where}.content: only text parts are served")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise Bad(f"{where}.content: expected a string or a list of text parts")
    return {"role": ROLES[item["role"]], "content": content}


def number_in(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise Bad(f"body.{key}: expected a number from {low} to {high}, got {value!r}")
    return float(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
