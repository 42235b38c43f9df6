"""OpenAI Batch result lines: ``{id, custom_id, response: {status_code, request_id, body},
error}``, the body shaped as the API's own response (an embedding list, a chat completion).

A refused or failed request's line carries its status code (400 for the request, 500 for a
row the model failed), an OpenAI-shaped ``{"error": ...}`` body, and ``error: {code,
message}``, so a reader that checks either finds it. Ids are derived from the line and its
``custom_id``, so a resumed run writes the same ids as an uninterrupted one.

The file is UTF-8, one JSON object a line. A refused line's ``custom_id`` is echoed as it was
sent, a lone surrogate included (``"\\ud83d"``, valid JSON that JavaScript and Java producers
write): that line alone is written with JSON's ``\\u`` escapes, which its producer reads back
as the same string, so every line stays UTF-8 and every custom_id matches its request.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import numpy as np


def digest(line: int, custom_id: str | None) -> str:
    key = f"{line}\0{custom_id}".encode("utf-8", "surrogatepass")  # any string sent has one
    return hashlib.sha256(key).hexdigest()[:24]


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """The results file's bytes: each line as UTF-8 JSON, or, where it holds a string that
    is not text (a lone surrogate echoed), with ASCII escapes instead."""
    out = []
    for line in lines:
        try:
            out.append(json.dumps(line, ensure_ascii=False).encode("utf-8"))
        except UnicodeEncodeError:
            out.append(json.dumps(line).encode("ascii"))
    return b"".join(text + b"\n" for text in out)


def result(line: int, custom_id: str | None, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """One result line around a response body."""
    key = digest(line, custom_id)
    response = {"status_code": status, "request_id": f"req_{key}", "body": body}
    error = body.get("error")
    failed = {"code": error["code"], "message": error["message"]} if error else None
    return {"id": f"batch_req_{key}", "custom_id": custom_id, "response": response, "error": failed}


def error_line(line: int, custom_id: str | None, code: str, message: str, status: int = 400):
    """A request that was refused (400) or that the model failed (500)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return result(line, custom_id, status, body)


def vector(values: np.ndarray, dimensions: int | None, encoding: str) -> list[float] | str:
    """An embedding as the API writes it: cut to ``dimensions`` and scaled back to unit length
    (a shortened OpenAI embedding is normalized), as floats or base64 little-endian float32."""
    values = np.asarray(values, dtype=np.float32)
    if dimensions is not None and dimensions < len(values):
        values = values[:dimensions]
        norm = float(np.linalg.norm(values))
        values = values / norm if norm > 0 else values
    if encoding == "base64":
        return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")
    return values.tolist()


def embedding_line(
    line: int,
    custom_id: str,
    *,
    vectors: list[np.ndarray],
    dimensions: int | None,
    encoding: str,
    model: str,
    tokens: int,
) -> dict[str, Any]:
    """A `/v1/embeddings` result: one embedding per input, in the request's order."""
    data = [
        {"object": "embedding", "index": i, "embedding": vector(v, dimensions, encoding)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return result(line, custom_id, 200, body)


def chat_line(
    line: int,
    custom_id: str,
    *,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    model: str,
    created: int,
) -> dict[str, Any]:
    """A `/v1/chat/completions` result: one assistant message."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    body = {
        "id": f"chatcmpl-{digest(line, custom_id)}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    return result(line, custom_id, 200, body)
