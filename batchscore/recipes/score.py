"""`batchscore.score`'s recipe: rows in memory scored as one shard of a job, nothing written.

The model for the call's settings is decided ("auto" measured on the rows' first distinct
inputs, as a job measures on its own), loaded, gated and calibrated once, then kept in this
process (`LOADED`), so a notebook that scores twice with the same settings pays for it once.
The rows then go through the run's own stages (`batchscore.pipeline.score_table`).

Calls take turns (`TURN`): a loaded model (its counters, its generation caches, the gate's
results) serves one call at a time, torch already spreads one call over every core, and two
calls loading models at once would import transformers from two threads, where one can meet
the other's half-initialised modules ("cannot import name 'AutoConfig'").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from batchscore.errors import InputDataError, JobError
from batchscore.job.column_names import clashes
from batchscore.job.sections import Job
from batchscore.measure.cache import open_cache
from batchscore.measure.decide import decide
from batchscore.measure.load import load_at
from batchscore.models.base import Task
from batchscore.models.fingerprint import model_identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import input_kinds
from batchscore.observe.progress import Progress
from batchscore.pipeline.known import Known
from batchscore.pipeline.score_table import MEMORY, MEMORY_SHARD, score_table
from batchscore.pipeline.stages import first_distinct
from batchscore.runtime.executor import Executor
from batchscore.work.row_errors import error_fields, with_errors
from batchscore.work.shards import check_columns

KEEP_LOADED = 2  # models kept loaded (each can be hundreds of MB)


def columns_read(job: Job) -> dict[str, str]:
    """The columns the job's task reads, each with the kind it must be ("text" or "numeric"):
    what the caller's frame must hold."""
    return input_kinds(job.model.task, job.input, job.options)


def score_rows(
    job: Job,
    table: pa.Table,
    *,
    bad: dict[int, str],
    names: list[str],
    environ: Mapping[str, str],
    progress: str = "off",
    delay_s: float = 0.0,
) -> pa.Table:
    """The task's columns (and ``error`` under ``on_error = "skip"``) for every row of
    ``table`` (the columns `columns_read` names), in its order.

    ``bad``: rows whose cells could not be read as their column's kind (row -> why), failed
    before anything loads, or under ``on_error = "skip"`` given that error. ``names``: the
    caller's own columns, which must not clash with those the task writes. ``environ``: the
    environment the caller passes in, where the cache folder is found. ``progress`` "bar"
    shows a bar on stderr once scoring has taken ``delay_s``.
    """
    task = job.model.task
    check_columns(MEMORY_SHARD, table.schema, (), columns_read(job))  # each of its kind
    if bad and job.output.on_error == "fail":  # a cell that is not text: nothing to load
        row, message = next(iter(bad.items()))
        raise InputDataError(f"{MEMORY}: row {row}, {message}")
    ready = load(job, table, environ)
    written = [f.name for f in ready.task.columns]
    written += [f.name for f in error_fields(job.output.on_error)]
    clash = [theirs for _, theirs in clashes(written, names)]  # case aside, as DuckDB
    if clash:
        raise JobError(
            f"score(): the data already has column(s) {', '.join(clash)}, which task "
            f"{task} writes (DuckDB, Spark and Hive ignore case); rename or drop them first"
        )
    batching = ready.job.batching  # "auto" decided
    known, ready.known = ready.known, None  # the gate's results: for this call's rows alone
    scored, _ = score_table(
        table,
        task=ready.task,
        executor=ready.executor,
        inp=job.input,
        batching=batching,
        on_error=job.output.on_error,
        progress=Progress(table.num_rows, progress, delay_s=delay_s),
        known=known,
    )
    # a cell that was not text (read as null) says what was wrong with it, not "text is null"
    return with_errors(scored, bad)


@dataclass
class Ready:
    """A model loaded for `score_rows`: the concrete job ("auto" decided), its task and
    executor."""

    job: Job
    task: Task
    executor: Executor
    known: Known | None = None  # the gate's results for the first call's first rows


LOADED: OrderedDict[str, Ready] = OrderedDict()  # settings -> model, least recently used first
TURN = threading.RLock()  # held by each call of the Python API, and by `load`


def load(job: Job, table: pa.Table, environ: Mapping[str, str]) -> Ready:
    """The model for these settings: loaded (gated, calibrated on ``table``'s first distinct
    rows, as `sample_rows` reads a job's) on first use, then reused for as long as it is among
    the `KEEP_LOADED` most recently used."""
    model_path = locate(job.model)
    key = repr((str(model_path), job.model, job.options, job.input, job.batching, job.quality))
    with TURN:
        if key in LOADED:
            LOADED.move_to_end(key)
            return LOADED[key]
        kinds = columns_read(job)  # repeats measure nothing
        sample = first_distinct(table.select(list(kinds)), job.quality.sample_rows, set())
        cache = open_cache(environ, job.quality.cache_dir)
        files, rows = model_identity(model_path), table.num_rows
        concrete, _, chosen = decide(
            job, model_path, None, sample, cache=cache, model_files=files, rows=rows
        )
        if chosen is not None and chosen.task is not None:  # the gate's model, ready to use
            ready = Ready(concrete, chosen.task, chosen.executor, chosen.known)
        else:
            executor = Executor(concrete.model)
            ready = Ready(concrete, load_at(concrete, model_path, executor, sample), executor)
        LOADED[key] = ready
        while len(LOADED) > KEEP_LOADED:
            LOADED.popitem(last=False)
        return ready
