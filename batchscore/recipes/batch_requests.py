"""OpenAI Batch request files read: one JSON object a line, each a request or why it is refused.

A line is ``{"custom_id", "method": "POST", "url", "body"}`` (OpenAI's batch input format, as
vLLM's ``run-batch`` reads it). `/v1/embeddings` and `/v1/chat/completions` are served; every
line that cannot be served (not UTF-8 or not Unicode text, not JSON, another url, another model,
a missing or wrong field, a ``custom_id`` seen before) becomes a `Refused` for its own line and
never stops the others. Pure: text in, requests out, so every refusal is tested without a model.

Text is checked here, once, before it goes anywhere: a JSON string may hold a lone surrogate
(``"\\ud83d"``, half an emoji, as JavaScript and Java producers write a string cut between
the two halves), which is valid JSON but not text: it can be neither written as UTF-8 (Parquet,
the results file) nor tokenized, so its line is refused here, naming the field, and no later
stage meets one.
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
from batchscore.models.text.inputs import BLANK

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
URLS = (EMBEDDINGS, CHAT)
MAX_STOPS = 4  # OpenAI's own limit on `stop`
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
BOM = b"\xef\xbb\xbf"  # what Windows tools write first in a UTF-8 file (and `cat` inside one)


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
    is served too. A ``custom_id`` belongs to the first line that names it, served or refused:
    every later line naming it is refused as a duplicate, so no custom_id is ever answered by
    a served line and another line too.
    """
    found: list[Request] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        request = read_line(number, raw.removeprefix(BOM), models)
        if request.custom_id in seen:
            first = seen[request.custom_id]
            message = (
                f"custom_id {request.custom_id!r} is used before, on line {first + 1}; each "
                "custom_id is answered once, for the first line that names it"
            )
            request = Refused(number, request.custom_id, "duplicate_custom_id", message)
        elif request.custom_id is not None:
            seen[request.custom_id] = number
        found.append(request)
    return found


def read_line(number: int, raw: bytes, models: set[str]) -> Request:
    """One line (``number`` counts from 0) as a request, or why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        message = f"line {number + 1} is not UTF-8 text: byte 0x{bad} at byte {exc.start + 1}"
        return Refused(
            number, named(parsed(raw.decode("utf-8", "replace"))), "invalid_unicode", message
        )
    try:
        item = json.loads(text)
    except ValueError as exc:
        return Refused(number, None, "invalid_json", f"line {number + 1} is not JSON: {exc}")
    except RecursionError:  # nested past the parser's depth: no request is shaped so
        message = f"line {number + 1} is not JSON this reader takes: nested too deeply"
        return Refused(number, None, "invalid_json", message)
    custom_id = named(item)
    try:
        if (cut := lone_surrogate(item)) is not None:
            raise Bad(cut, "invalid_unicode")
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
            message = (
                f"body.model: {model!r} is not the model served ({served}); "
                "run-batch --served-model-name NAME answers to the name the requests give"
            )
            raise Bad(message, "model_mismatch")
        if url == EMBEDDINGS:
            return embeddings(number, custom_id, body)
        return chat(number, custom_id, body)
    except Bad as exc:
        return Refused(number, custom_id, exc.code, str(exc))
    except RecursionError:  # a schema or field nested deeper than its checks walk
        message = f"line {number + 1}: nested too deeply to serve"
        return Refused(number, custom_id, "invalid_request", message)


def parsed(text: str) -> Any:
    """``text`` as JSON, or None where it is not (a line read only for its custom_id)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def named(item: Any) -> str | None:
    """A line's ``custom_id``: a non-empty string without a character that undecodable bytes
    became (U+FFFD), or None."""
    custom_id = item.get("custom_id") if isinstance(item, dict) else None
    if isinstance(custom_id, str) and custom_id and "\ufffd" not in custom_id:
        return custom_id
    return None


def lone_surrogate(item: Any) -> str | None:
    """Where the first string of a parsed line (a key or a value, at any depth) holds a lone
    surrogate, and which: None when every string is text. Walked without recursion, so a line
    as deep as the parser takes is walked too."""
    pending: list[tuple[str, Any]] = [("", item)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, dict):
            for key in value:
                if not encodable(key):
                    return surrogate_at(f"a key of {where or 'the line'}", key)
            pending.extend((f"{where}.{k}" if where else k, v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            pending.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, str) and not encodable(value):
            return surrogate_at(where or "the line", value)
    return None


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def surrogate_at(where: str, text: str) -> str:
    at = next(i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
    return (
        f"{where}: a lone surrogate \\u{ord(text[at]):04x} at character {at + 1} (half of a "
        "character such as an emoji, its string cut between the halves by its producer) is "
        "not Unicode text; send whole characters"
    )


def embeddings(number: int, custom_id: str, body: dict[str, Any]) -> Embeddings:
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise Bad("body.input: expected a string or a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise Bad("body.input: token ids are not served; send the texts as strings")
    blank = next((i for i, t in enumerate(texts) if BLANK.fullmatch(t)), None)
    if blank is not None:  # the pipeline's own rule: such a text has nothing to embed
        where = "body.input" if isinstance(given, str) else f"body.input[{blank}]"
        raise Bad(f"{where}: empty, or only whitespace and invisible characters")
    dimensions = optional(body, "dimensions", None)
    if dimensions is not None and (not is_int(dimensions) or dimensions < 1):
        raise Bad(f"body.dimensions: expected a positive integer, got {dimensions!r}")
    encoding = optional(body, "encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise Bad(f"body.encoding_format: expected 'float' or 'base64', got {encoding!r}")
    return Embeddings(number, custom_id, tuple(texts), dimensions, encoding)


def chat(number: int, custom_id: str, body: dict[str, Any]) -> ChatRequest:
    messages = [message(m, i) for i, m in enumerate(listed(body.get("messages"), "messages"))]
    schema = response_schema(body.get("response_format"))
    if optional(body, "n", 1) != 1:
        raise Bad(f"body.n: one choice per request is served, got {body.get('n')!r}")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    most = optional(body, key, None)
    if most is not None and (not is_int(most) or not 1 <= most <= MAX_NEW_TOKENS):
        raise Bad(f"body.{key}: expected an integer from 1 to {MAX_NEW_TOKENS}, got {most!r}")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS:
        raise Bad(f"body.stop: expected a string or a list of up to {MAX_STOPS} strings")
    if not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise Bad(f"body.stop: each stop is a string of 1 to {MAX_STOP_CHARS} characters")
    temperature = number_in(body, "temperature", 0.0, 0.0, 2.0)
    top_p = number_in(body, "top_p", 1.0, 0.01, 1.0)
    seed = optional(body, "seed", 0)
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
        if not all(isinstance(p.get("text"), str) for p in content):
            raise Bad(f"{where}.content: a text part's text: expected a string")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise Bad(f"{where}.content: expected a string or a list of text parts")
    return {"role": ROLES[item["role"]], "content": content}


def number_in(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = optional(body, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise Bad(f"body.{key}: expected a number from {low} to {high}, got {value!r}")
    return float(value)


def optional(body: dict[str, Any], key: str, default: Any) -> Any:
    """An optional field's value: ``null`` is absent, as OpenAI reads it (JSON producers
    write null for a field they leave unset)."""
    value = body.get(key)
    return default if value is None else value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
