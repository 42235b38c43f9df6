"""The command line's commands over a model rather than a job file: run-batch (a request file
served by a model), models (what this machine can run) and fetch (a model into the local
Hugging Face cache, the one command that uses the network). `batchscore.cli` adds them to
its group; each parses, calls one recipe, and reports, as the job commands do.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from batchscore.exits import (
    PROGRESS,
    SET,
    Command,
    chosen_progress,
    data,
    deliver,
    reports_errors,
    say,
    settings,
    stopping_on_signals,
)
from batchscore.heap import paused


@click.command("run-batch", cls=Command)
@click.option(
    "-i", "--input", "source", required=True, help="The request file (JSONL; a path or s3://)."
)
@click.option(
    "-o", "--output", "target", required=True, help="Where the results go (JSONL; a path or s3://)."
)
@click.option(
    "--model", required=True, metavar="NAME_OR_PATH", help="The model every request is served by."
)
@click.option(
    "--served-model-name",
    "served",
    multiple=True,
    metavar="NAME",
    help="A name the requests' body.model may give the model, in place of its own (repeatable; "
    "responses carry the first), as vLLM's flag of that name.",
)
@SET
@click.option("--work-dir", default=None, help="The work folder (default: OUTPUT.work, beside it).")
@PROGRESS
@reports_errors
def run_batch(
    source: str,
    target: str,
    model: str,
    served: tuple[str, ...],
    overrides: tuple[str, ...],
    work_dir: str | None,
    progress: str,
) -> None:
    """Serve an OpenAI Batch request file (/v1/embeddings, /v1/chat/completions) offline and
    write OpenAI Batch result lines, one per request in the file's order. A bad line becomes
    an error line for its custom_id; a killed run-batch started again scores only what it had
    not committed. A file written for OpenAI (each body naming "text-embedding-3-small") is
    served with --served-model-name text-embedding-3-small. --set sets keys of the jobs it
    runs (model.precision=fp32). Exits 3 when not one request could be served (every line an
    error line, all written).

    \b
    Example:
        batchscore run-batch -i requests.jsonl -o results.jsonl --model all-MiniLM-L6-v2
        batchscore run-batch -i s3://b/requests.jsonl -o s3://b/results.jsonl --model models/chat
    """
    with paused():
        from batchscore.recipes.run_batch import run_batch as serve

    with stopping_on_signals():
        report = serve(
            source,
            target,
            model=model,
            served=served,
            overrides=overrides,
            work=work_dir,
            progress=chosen_progress(progress),
            environ=os.environ,
        )
    text = f"{target}: {report.requests} results, {report.failed} of them errors"
    say(text, event="run-batch", output=target, requests=report.requests, failed=report.failed)


@click.command("models", cls=Command)
@click.option(
    "--path",
    "paths",
    multiple=True,
    type=click.Path(),
    help="Another folder of local models, besides ./models (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@reports_errors
def models(paths: tuple[str, ...], as_json: bool) -> None:
    """List the models this machine can run, and what as: the built-in model, the local
    models under ./models and each --path folder, and every model of the Hugging Face cache
    (HF_HUB_CACHE, else HF_HOME/hub), each with the tasks its files run as, its size on
    disk, where it is and how a job names it. Nothing is loaded or downloaded.

    \b
    Example:
        batchscore models
        batchscore models --path /data/models --json
    """
    with paused():
        from batchscore.recipes.catalog import catalog, catalog_data, check_folders, format_catalog

    folders = [Path(p) for p in paths]
    check_folders(folders)
    found = catalog([Path("models"), *folders], environ=os.environ)
    if as_json:
        deliver(data(catalog_data(found)))
    else:
        say(format_catalog(found), event="models", product=True, models=len(found.models))


@click.command("fetch", cls=Command)
@click.argument("name")
@click.option("--revision", default=None, help="A branch, tag or commit (default: main).")
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Fetch pickle weights (pytorch_model*.bin) too; a job loads them only with "
    "[model].allow_pickle = true.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@PROGRESS
@reports_errors
def fetch(
    name: str, revision: str | None, allow_pickle: bool, as_json: bool, progress: str
) -> None:
    """Download the Hugging Face model NAME into the local Hugging Face cache, where jobs
    naming it find it offline from then on: the only command that uses the network (HF_ENDPOINT
    where set; HF_TOKEN for gated and private models). Only the files batchscore reads come
    down: configs, tokenizer files and safetensors weights. Exits 4 when the hub has no such
    model or revision, 7 when the hub cannot be reached (run it again later).

    \b
    Example:
        batchscore fetch BAAI/bge-small-en-v1.5
        batchscore fetch Qwen/Qwen2.5-0.5B-Instruct --revision main --json
    """
    with paused():
        from batchscore.recipes.fetch import fetch as fetch_model
        from batchscore.recipes.fetch import fetched_data, format_fetched

    found = fetch_model(
        name,
        revision=revision,
        allow_pickle=allow_pickle,
        progress=chosen_progress(progress) == "bar",
        verbose=settings().verbose,
        environ=os.environ,
    )
    if as_json:
        deliver(data(fetched_data(found)))
    else:
        say(format_fetched(found), event="fetched", name=name, path=found.path, tasks=found.tasks)
