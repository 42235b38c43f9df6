"""Chat requests held to the model's context before any job runs, as OpenAI holds them.

A decoder-only model's prompt and the tokens it generates share its positions, so a request
whose messages (through the chat template) and completion (its ``max_tokens``, or the job's
``[generate].max_new_tokens`` when it sets none) need more than the model has cannot be served
as asked: `run` would cut the prompt's start to fit, which drops the conversation's first
turns, and a completion longer than the whole context fits no prompt at all. Each such request
is refused alone, with OpenAI's own words and code (``context_length_exceeded``, 400), and the
others are served. A seq2seq model's prompt is held to its encoder's context alone.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from batchscore.errors import JobError, ModelError
from batchscore.job.sections import Job
from batchscore.models.generate import PromptEncoding
from batchscore.models.source.locate import locate
from batchscore.models.tasks import encoding
from batchscore.recipes.batch_requests import ChatRequest, Refused, Request

CODE = "context_length_exceeded"


def within_context(requests: list[Request], job: Job) -> list[Request]:
    """``requests`` with each chat request over the model's context refused. ``job``: a chat
    job as run-batch builds them (model, overrides); a model that cannot build one is left to
    the jobs to report, as they run."""
    chats = [r for r in requests if isinstance(r, ChatRequest)]
    if not chats:
        return requests
    try:  # one new token: the encoding builds for any completion; each request brings its own
        options = dataclasses.replace(job.options, max_new_tokens=1)
        prompts = encoding(locate(job.model), model=job.model, options=options, inp=job.input)
    except (JobError, ModelError):
        return requests
    if not isinstance(prompts, PromptEncoding):
        return requests
    lengths = prompts.whole_lengths(pa.table({job.input.text: [r.messages for r in chats]}))
    context, shared = prompts.context
    refused: dict[int, Refused] = {}
    for row, request in enumerate(chats):
        if row not in lengths:
            continue
        messages = min(lengths[row], job.model.max_length or lengths[row])  # a cut asked for
        asked = request.decoding.max_new_tokens
        completion = (asked or job.options.max_new_tokens) if shared else 0
        if messages + completion > context:
            why = over(context, messages, completion, defaulted=asked is None)
            refused[request.line] = Refused(request.line, request.custom_id, CODE, why)
    return [refused.get(r.line, r) for r in requests]


def over(context: int, messages: int, completion: int, *, defaulted: bool) -> str:
    """OpenAI's words for a request longer than the model's context."""
    if not completion:
        return (
            f"This model's maximum context length is {context} tokens. However, your messages "
            f"resulted in {messages} tokens. Please reduce the length of the messages."
        )
    said = (
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{messages + completion} tokens ({messages} in the messages, {completion} in the "
        "completion). Please reduce the length of the messages or completion."
    )
    if defaulted:
        said += (
            f" This request sets no max_tokens, so its completion is run-batch's default of "
            f"{completion} tokens (--set generate.max_new_tokens=N changes it)."
        )
    return said
