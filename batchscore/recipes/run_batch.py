"""`batchscore run-batch`'s recipe: an OpenAI Batch request file scored as ordinary jobs.

The requests become Parquet shards in a work folder beside the output (``RESULTS.work/``): one
job for the embeddings, one per distinct decoding of the chat requests (OpenAI lets each
request set its own ``max_tokens``, ``stop`` and ``temperature``; a job has one). Each job
runs through `run_job`, with its reader, batching, checkpoints and resume: a killed run-batch
started again scores only what was not committed. Only when every job is complete are the
result lines written, from the committed output, in the request file's order, atomically
(a temporary file renamed, or one whole-object upload): a reader never meets half a file, and
every request has exactly one line.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import BadRowsError, JobError, ModelError
from batchscore.job.parse import apply_overrides, job_from_dict
from batchscore.job.sections import Job
from batchscore.models.source.locate import locate
from batchscore.models.tasks import encoding
from batchscore.recipes.batch_context import within_context
from batchscore.recipes.batch_files import (
    check_paths,
    committed,
    read_bytes,
    write_if_changed,
    write_whole,
)
from batchscore.recipes.batch_requests import (
    ChatRequest,
    Decoding,
    Embeddings,
    Refused,
    read_requests,
)
from batchscore.recipes.batch_results import chat_line, embedding_line, error_line, jsonl
from batchscore.recipes.batch_words import in_batch_words
from batchscore.recipes.run import run_job
from batchscore.storage.fs import is_url, local_path

CHUNK_ROWS = 1000  # rows per commit: what a killed run-batch may have to score again
SHARD = "requests.parquet"
MISSING = "not in the committed output (a [input].where set with --set drops it)"
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # ours -> OpenAI's finish_reason


@dataclass
class BatchReport:
    """What run-batch wrote: the results file, its lines, and each job's run report (None for
    a job that found every row committed)."""

    output: str
    requests: int = 0
    failed: int = 0
    runs: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass
class Group:
    """The requests one job scores: its rows (``line``, ``item``, ``text``) and task sections."""

    task: str
    requests: list[Embeddings | ChatRequest]
    sections: dict[str, dict[str, Any]]

    def table(self) -> pa.Table:
        lines, items, texts = [], [], []
        for request in self.requests:
            parts = request.texts if isinstance(request, Embeddings) else (request.messages,)
            for i, text in enumerate(parts):
                lines.append(request.line)
                items.append(i)
                texts.append(text)
        return pa.table(
            {
                "line": pa.array(lines, pa.int64()),
                "item": pa.array(items, pa.int32()),
                "text": pa.array(texts, pa.string()),
            }
        )


def run_batch(
    source: str,
    target: str,
    *,
    model: str,
    served: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
    work: str | None = None,
    progress: str = "off",
    environ: Mapping[str, str] | None = None,
) -> BatchReport:
    """Score every request of the file ``source`` with ``model`` (a built-in name, a Hugging
    Face id in the local cache, or a local folder) and write one result line per request to
    ``target``. ``served``: the names the requests may give the model (``--served-model-name``,
    as vLLM's: they replace its own, and responses carry the first). ``overrides``: ``--set``
    keys of the jobs (``model.precision=fp32``, ``output.chunk_rows=100``). ``work``: the work
    folder (default ``TARGET.work``). A file none of whose requests could be served has its
    error lines written, then raises `BadRowsError` (exit 3)."""
    folder = work or f"{target}.work"
    check_paths(source, target, folder)
    answer = served[0] if served else model  # the name every response's `model` carries
    requests = read_requests(read_bytes(source).splitlines(), served_names(model, served))
    requests = held_to_context(requests, folder=folder, model=model, overrides=overrides)
    report = BatchReport(target)
    lines: dict[int, dict[str, Any]] = {}
    refusals: list[JobError | ModelError] = []
    found = groups(requests)
    for name, group in found.items():
        try:  # the model may not serve this url (an encoder asked to chat)
            with in_batch_words(job_folder(folder, name)):
                job = group_job(group, name, folder=folder, model=model, overrides=overrides)
                write_if_changed(f"{job.input.path[0]}/{SHARD}", group.table())
                report.runs[name] = run_job(job, progress=progress, environ=environ)
        except (JobError, ModelError) as exc:
            refusals.append(exc)
            lines.update(unserved(group, str(exc)))
            continue
        lines.update(group_lines(group, job, committed(job.output.path), answer))
    if refusals and len(refusals) == len(found):
        raise refusals[0]  # no request could be served: the model or --set is wrong, not a line
    for request in requests:
        if isinstance(request, Refused):
            lines[request.line] = error_line(
                request.line, request.custom_id, request.code, request.message
            )
    ordered = [lines[number] for number in sorted(lines)]
    report.requests = len(ordered)
    report.failed = sum(1 for line in ordered if line["error"] is not None)
    write_whole(target, jsonl(ordered))
    if ordered and report.failed == report.requests:
        raise none_served(source, target, ordered)
    return report


def none_served(source: str, target: str, lines: list[dict[str, Any]]) -> BadRowsError:
    """Every line an error line: the file's results are written, and the command fails, as a
    run fails whose rows are all bad, so that a scheduler never takes the file for served."""
    codes = Counter(line["error"]["code"] for line in lines)
    counts = ", ".join(f"{code}: {count}" for code, count in codes.most_common())
    every = (
        f"all {len(lines)} lines are error lines"
        if len(lines) > 1
        else "its one line is an error line"
    )
    message = f"no request of {source} could be served: {every} in {target} ({counts})"
    if "model_mismatch" in codes:
        message += (
            "\nthe requests name another model in body.model: --served-model-name NAME serves "
            "--model under the name they give (as vLLM's flag does)"
        )
    return BadRowsError(message)


def held_to_context(
    requests: list[Any], *, folder: str, model: str, overrides: tuple[str, ...]
) -> list[Any]:
    """The requests with each chat request longer than the model's context refused
    (`batch_context`), measured with a chat job as run-batch builds them."""
    chats = [r for r in requests if isinstance(r, ChatRequest)]
    if not chats:
        return requests
    group = Group("generate", chats, {"generate": generate_keys(Decoding(None, (), 0.0, 1.0, 0))})
    try:
        job = group_job(group, "context", folder=folder, model=model, overrides=overrides)
    except (JobError, ModelError):  # the chat jobs say why, as they are built
        return requests
    return within_context(requests, job)


def served_names(model: str, served: tuple[str, ...] = ()) -> set[str]:
    """The names a request's ``body.model`` may give: the ``--served-model-name`` names where
    there are any (in place of the model's own, as in vLLM), else the model as named and a
    local folder's own name."""
    if served:
        return set(served)
    return {model, Path(model).name} if not is_url(model) else {model}


def model_keys(model: str) -> dict[str, str]:
    """``[model]`` naming the model: a local folder by path, anything else by name."""
    local = Path(model).expanduser()
    return {"path": str(local.resolve())} if local.exists() else {"name": model}


def groups(requests: list[Any]) -> dict[str, Group]:
    """The jobs to run, by name: the embeddings, then the chat requests by decoding."""
    found: dict[str, Group] = {}
    for request in requests:
        if isinstance(request, Embeddings):
            found.setdefault("embeddings", Group("embed", [], {})).requests.append(request)
        elif isinstance(request, ChatRequest):
            name = f"chat-{decoding_key(request.decoding)}"
            sections = {"generate": generate_keys(request.decoding)}
            found.setdefault(name, Group("generate", [], sections)).requests.append(request)
    return found


def decoding_key(decoding: Decoding) -> str:
    return hashlib.sha256(repr(decoding).encode()).hexdigest()[:12]


def generate_keys(decoding: Decoding) -> dict[str, Any]:
    """``[generate]`` for one decoding: the conversation through the chat template, greedy at
    temperature 0 and seeded sampling above it, and the answer held to a response_format's
    schema."""
    keys: dict[str, Any] = {"chat": True, "messages": True}
    if decoding.max_new_tokens is not None:
        keys["max_new_tokens"] = decoding.max_new_tokens
    if decoding.stop:
        keys["stop"] = list(decoding.stop)
    if decoding.temperature > 0:
        keys.update(do_sample=True, temperature=decoding.temperature, seed=decoding.seed)
        keys["top_p"] = decoding.top_p
    if decoding.schema is not None:  # response_format json_schema: held to it while decoding
        keys["json_schema"] = json.loads(decoding.schema)
    return keys


def group_job(
    group: Group, name: str, *, folder: str, model: str, overrides: tuple[str, ...]
) -> Job:
    """The job that scores a group: its shard in ``folder/name/input``, its output in
    ``folder/name/output``, every row written with its error rather than failing its chunk."""
    base = job_folder(folder, name)
    raw: dict[str, Any] = {
        "name": f"run-batch-{name}",
        "input": {"path": f"{base}/input", "text": "text", "keep": ["line", "item"]},
        "model": {"task": group.task, **model_keys(model)},
        "output": {
            "path": f"{base}/output",
            "on_error": "skip",
            "max_bad_share": 1.0,
            "chunk_rows": CHUNK_ROWS,
        },
        **{key: dict(value) for key, value in group.sections.items()},
    }
    apply_overrides(raw, list(overrides))
    return job_from_dict(raw, Path(f"run-batch {name}"))


def job_folder(folder: str, name: str) -> str:
    """A job's own folder in the work folder (absolute, for its messages): removing it starts
    that job over."""
    base = folder if is_url(folder) else str(local_path(folder).expanduser().resolve())
    return f"{base}/{name}"


def group_lines(group: Group, job: Job, output: pa.Table, model: str) -> dict[int, dict[str, Any]]:
    """Each of the group's requests' result line, by line number, from its committed rows."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for row in output.sort_by([("line", "ascending"), ("item", "ascending")]).to_pylist():
        rows.setdefault(row["line"], []).append(row)
    if group.task == "embed":
        return embed_lines(group, job, rows, model)
    created = int(time.time())
    lines = {}
    for request in group.requests:
        row = rows.get(request.line, [{"error": MISSING}])[0]
        if row.get("error"):
            lines[request.line] = failed(request, row["error"])
            continue
        lines[request.line] = chat_line(
            request.line,
            request.custom_id,
            text=row["generated"],
            finish_reason=FINISH.get(row["finish_reason"], row["finish_reason"]),
            prompt_tokens=row["prompt_tokens"],
            completion_tokens=row["generated_tokens"],
            model=model,
            created=created,
        )
    return lines


def embed_lines(
    group: Group, job: Job, rows: dict[int, list[dict[str, Any]]], model: str
) -> dict[int, dict[str, Any]]:
    """Embedding results, their usage counted by the job's own encoding (its tokenizer, its
    window, its special tokens: the tokens the model saw)."""
    counts = token_counts(job, group.table())
    lines = {}
    for request in group.requests:
        found = rows.get(request.line, [{"error": MISSING}])
        bad = next((row["error"] for row in found if row.get("error")), None)
        width = len(found[0]["embedding"]) if bad is None else 0
        if bad is not None:
            lines[request.line] = failed(request, bad)
        elif request.dimensions is not None and request.dimensions > width:
            message = f"body.dimensions: {request.dimensions} is more than the model's {width}"
            lines[request.line] = error_line(
                request.line, request.custom_id, "invalid_request", message
            )
        else:
            lines[request.line] = embedding_line(
                request.line,
                request.custom_id,
                vectors=[np.asarray(row["embedding"]) for row in found],
                dimensions=request.dimensions,
                encoding=request.encoding_format,
                model=model,
                tokens=counts.get(request.line, 0),
            )
    return lines


def token_counts(job: Job, table: pa.Table) -> dict[int, int]:
    """Tokens the model read per request line (every window of a long text counted)."""
    encoded = encoding(locate(job.model), model=job.model, options=job.options, inp=job.input)
    units = encoded.encode(table)
    per_row = np.zeros(table.num_rows, dtype=np.int64)
    np.add.at(per_row, units.rows[units.owners], units.lengths)
    counts: dict[int, int] = {}
    for line, tokens in zip(table.column("line").to_pylist(), per_row.tolist(), strict=True):
        counts[line] = counts.get(line, 0) + tokens
    return counts


def unserved(group: Group, why: str) -> dict[int, dict[str, Any]]:
    """Every request of a group the model cannot serve, as an error line."""
    return {
        r.line: error_line(r.line, r.custom_id, "model_not_supported", why) for r in group.requests
    }


def failed(request: Embeddings | ChatRequest, why: str) -> dict[str, Any]:
    return error_line(request.line, request.custom_id, "scoring_error", why, status=500)
