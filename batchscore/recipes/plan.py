"""`batchscore plan`: what a run would do, without running it (and without the model's weights).

The pending chunks come from the commit records (read, never changed); their rows go through
the run's own reader and `where`, then the task's own encoding, built without its weights
(`models.tasks.encoding`), and the run's own windows and sampler
(`pipeline.stages.windows`), so rows, tokens, batches and padding are what the run will meet.
Above `sample_rows` rows to score, only a seeded random sample of rows is tokenized: the token
total is then an estimate with a 95% interval, and padding is measured by running the sampler
on windows drawn from the sampled lengths. The time estimate is `batchscore.recipes.estimate`'s.

A plan exits as the run it plans would before scoring anything: a folder the run refuses (other
settings or another job's output, exit 5; a job record nothing proves, exit 10), a model file
gone (exit 4), or a job whose rows with an error are over `[output].max_bad_share` already
(exit 3: the run fails however the rest turns out), so `plan && run` never lets through a run
that cannot succeed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import BadRowsError, InputDataError
from batchscore.job.sections import Job
from batchscore.models.base import Encoding
from batchscore.models.fingerprint import identity
from batchscore.models.tasks import encoding, input_kinds
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.claim import Identity, refusal_error
from batchscore.output.diff import rows_line
from batchscore.output.format_table import open_format
from batchscore.output.survey import Survey
from batchscore.output.todo import to_do
from batchscore.output.verdict import bad_share_error
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.reader import read_rows
from batchscore.pipeline.sampler import padded_tokens
from batchscore.pipeline.stages import input_columns, windows
from batchscore.work.columns import gather
from batchscore.work.folders import with_folder
from batchscore.work.shards import find_shards, open_shard
from batchscore.work.units import Chunk, Shard, Window

SAMPLE_ROWS = 50_000  # rows tokenized at most; above that, tokens are estimated from a sample
Z95 = 1.96
SEED = 0


@dataclass
class Counts:
    """What the plan counts while it reads."""

    rows: int = 0  # rows that pass `where`
    filtered: int = 0
    units: int = 0
    tokens: int = 0  # exact: every row; sampled: the sample's
    computed_tokens: int = 0  # tokens of distinct units (repeats are scored once)
    distinct: int = 0  # units that are no repeat of an earlier one in their window
    padded_tokens: int = 0
    batches: int = 0
    truncated: int = 0
    bad_rows: int = 0
    sampled_rows: int = 0
    row_tokens: list[int] = field(default_factory=list)  # sampled: tokens of each sampled row
    unit_sizes: list[int] = field(default_factory=list)  # sampled: lengths + reserve of units
    failures: list[dict[str, str]] = field(default_factory=list)
    timing_rows: list[pa.Table] = field(default_factory=list)  # rows for the timed sample


def plan_counts(
    job: Job,
    model_path: Path,
    *,
    sample_rows: int = SAMPLE_ROWS,
    claimed: Job | None = None,
    timing_rows: int = 0,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], pa.Table | None]:
    """Everything but the time estimate: input, committed and pending work, tokens, padding;
    and about ``timing_rows`` rows drawn at random from those to score, to time the model on.

    ``claimed``: the job as a run claims the output with (before "auto" is settled), for the
    check that the output's committed work was made with the same settings; ``environ``: the
    front door's, whose object-store variables the output's format may read.
    """
    ckpt = Checkpoint(job.output.path)
    ckpt.format = open_format(job, ckpt.store, environ)  # read, never written, here
    kinds = input_kinds(job.model.task, job.input, job.options)
    shards = find_shards(job.input)
    who = identity(claimed or job, model_path)
    conflict = judge(ckpt, who)  # before the diff: another job's files are not this job's
    todo = to_do(
        ckpt,
        Survey(
            inp=job.input,
            kinds=kinds,
            chunk_rows=job.output.chunk_rows,
            shards=tuple(shards),
            fingerprint=who.fingerprint,
        ),
    )
    over = bad_share_error(
        todo.bad_by_shard, total=todo.total_rows, limit=job.output.max_bad_share, ckpt=ckpt
    )
    if over is not None:  # the job's bad rows are over already: a run fails, scoring or not
        raise BadRowsError(f"{job.source}: a run fails the bad-row gate: {over}")
    task_encoding = encoding(model_path, model=job.model, options=job.options, inp=job.input)
    to_read = sum(c.picked for c in todo.chunks)
    fraction = min(1.0, sample_rows / to_read) if to_read else 1.0
    timing = min(1.0, timing_rows / to_read) if to_read else 0.0
    counts = count(job, todo.chunks, task_encoding, kinds=kinds, fraction=fraction, timing=timing)
    timing_table = gather([t for t in counts.timing_rows if t.num_rows])
    budget = job.batching.max_tokens if isinstance(job.batching.max_tokens, int) else None
    failing = {f["shard"] for f in todo.failures}  # unreadable footers: no row count
    planned = {
        "job": job.name,
        "output": job.output.path,
        "model": str(model_path),
        "shards": len(shards),
        "input_rows": input_rows(shards, failing),
        "rows_committed": todo.done_rows,
        "chunks_committed": todo.done_chunks,
        "chunks_to_score": len(todo.chunks),
        "rows_to_read": to_read,
        "rows_to_score": counts.rows,
        "filtered": counts.filtered,
        "where": job.input.where,
        "tokens": tokens(counts, fraction),
        "padding": padding(job, counts, fraction, task_encoding),
        "max_tokens": budget,
        "truncated": counts.truncated if fraction == 1 else None,
        "bad_rows": counts.bad_rows if fraction == 1 else None,
        "failures": todo.failures + counts.failures,
        "conflict": conflict,
        "settled": settled.to_json() if (settled := ckpt.settled()) else None,
        "increments": todo.increments,  # by rows: rows to score and to retire (`output.diff`)
        "notes": [rows_line(todo.increments)] if todo.increments is not None else [],
    }
    return planned, timing_table


def judge(ckpt: Checkpoint, who: Identity) -> str | None:
    """Raise what a run of ``who`` would refuse the folder with (exit 5, or 10 for a job
    record nothing proves), as `status` judges it: a model file gone since is the model's
    error (exit 4). Returns a damaged job record the data files prove, which the run
    rewrites: a warning, no conflict (None: none)."""
    if not ckpt.claimed():
        return None
    refused = refusal_error(ckpt, who)
    if refused is not None:
        raise refused
    try:
        ckpt.job()
    except Damaged as exc:
        return str(exc)
    return None


def input_rows(shards: list[Shard], failing: set[str]) -> int:
    """The rows the shards' footers count, but for those failing (an unreadable footer has no
    count: the plan lists it among the failures)."""
    rows = 0
    for shard in shards:
        if shard.path not in failing:
            try:
                rows += open_shard(shard).metadata.num_rows
            except InputDataError:  # unreadable since the plan was made: counted as failing
                continue
    return rows


def count(
    job: Job,
    chunks: list[Chunk],
    task_encoding: Encoding,
    *,
    kinds: dict[str, str],
    fraction: float,
    timing: float,
) -> Counts:
    """Read every pending row (the run's reader and `where`); tokenize all of them, or with
    ``fraction`` < 1 a seeded random sample of them. Keep a random ``timing`` share of the
    rows too: rows like the run's, for the timed sample (`batchscore.recipes.estimate`)."""
    counts = Counts()
    rng, pick = np.random.default_rng(SEED), np.random.default_rng(SEED + 1)
    if fraction >= 1:  # every row, through the run's own windows: the run's very batches
        read = windows(
            chunks,
            task_encoding,
            inp=job.input,
            kinds=kinds,
            batching=job.batching,
            on_error=job.output.on_error,
        )
        for window in read:
            if window.error is not None:  # the run would fail this shard alone, as here
                counts.failures.append(
                    {"shard": window.chunk.shard.path, "error": str(window.error)}
                )
                continue
            table = window.table
            counts.rows += table.num_rows
            counts.filtered += sum(p.rows.dropped for p in window.parts)
            counts.timing_rows.append(table.take(np.flatnonzero(pick.random(len(table)) < timing)))
            add_window(counts, window)
        return counts
    row_filter = job.input.row_filter
    columns, failed = input_columns(job.input, kinds), set()
    for chunk in chunks:
        if chunk.shard.index in failed:
            continue
        try:
            for rows in read_rows(chunk, columns, job.batching.window_rows, row_filter):
                rows.table = with_folder(rows.table, chunk.shard.path, kinds)
                counts.rows += rows.table.num_rows
                counts.filtered += rows.dropped
                kept = np.flatnonzero(pick.random(rows.table.num_rows) < timing)
                counts.timing_rows.append(rows.table.take(kept))
                picked = np.flatnonzero(rng.random(rows.table.num_rows) < fraction)
                add_sample(counts, task_encoding, rows.table.take(picked))
        except InputDataError as exc:  # the run would fail this shard alone, as here
            failed.add(chunk.shard.index)
            counts.failures.append({"shard": chunk.shard.path, "error": str(exc)})
    return counts


def add_window(counts: Counts, window: Window) -> None:
    """Every row of a window, cut into batches exactly as the run cuts them."""
    encoded = window.encoded
    counts.units += len(encoded.lengths)
    counts.tokens += int(encoded.lengths.sum())
    counts.computed_tokens += int(encoded.lengths[window.units].sum())
    counts.distinct += len(window.units)
    counts.padded_tokens += padded_tokens(encoded.lengths, window.batches)
    counts.batches += len(window.batches)
    counts.truncated += encoded.truncated
    counts.bad_rows += len(encoded.errors)


def add_sample(counts: Counts, task_encoding: Encoding, table: Any) -> None:
    """Sampled rows: each row's tokens (0 for a row that cannot be encoded), and unit sizes."""
    encoded = task_encoding.encode(table)
    per_row = np.zeros(table.num_rows, dtype=np.int64)
    np.add.at(per_row, encoded.rows[encoded.owners], encoded.lengths)
    counts.row_tokens += per_row.tolist()
    counts.unit_sizes += (encoded.lengths + encoded.reserve).tolist()
    counts.sampled_rows += table.num_rows
    counts.bad_rows += len(encoded.errors)
    counts.truncated += encoded.truncated


def tokens(counts: Counts, fraction: float) -> dict[str, Any]:
    """The token total: exact, or N x the sample's mean with a 95% interval (simple random
    sample without replacement: the standard error shrinks as the sample nears the whole).

    Tokens are counted after truncation to the model's window (``truncated`` inputs were
    cut). Exact counts also say what the model will run: inputs that repeat an earlier one
    in their window (``repeats``) are scored once, so ``to_run`` tokens, fewer than
    ``value``, are what is padded into batches."""
    if fraction >= 1:
        return {
            "value": counts.tokens,
            "exact": True,
            "to_run": counts.computed_tokens,
            "repeats": counts.units - counts.distinct,
            "truncated": counts.truncated,
        }
    n, total = len(counts.row_tokens), counts.rows
    if not n:
        return {"value": 0, "exact": False, "low": 0, "high": 0, "sampled_rows": 0}
    values = np.asarray(counts.row_tokens, dtype=np.float64)
    spread = values.std(ddof=1) if n > 1 else values.mean()
    error = Z95 * total * spread / math.sqrt(n) * math.sqrt(max(0.0, 1 - n / max(total, 1)))
    value = total * values.mean()
    return {
        "value": round(value),
        "exact": False,
        "low": max(0, round(value - error)),
        "high": round(value + error),
        "sampled_rows": n,
        "confidence": 0.95,
    }


def padding(job: Job, counts: Counts, fraction: float, task_encoding: Encoding) -> dict[str, Any]:
    """Padded tokens and efficiency: the run's own batches, or (sampled) the sampler run on
    windows drawn from the sampled unit lengths, each as large as a run's window."""
    if fraction >= 1:
        efficiency = counts.computed_tokens / counts.padded_tokens if counts.padded_tokens else 1.0
        return {
            "padded_tokens": counts.padded_tokens,
            "batches": counts.batches,
            "efficiency": round(efficiency, 4),
            "exact": True,
        }
    sizes = np.asarray(counts.unit_sizes, dtype=np.int64)
    if not len(sizes):
        return {"padded_tokens": 0, "batches": 0, "efficiency": 1.0, "exact": False}
    budget = job.batching.max_tokens if isinstance(job.batching.max_tokens, int) else 8192
    policy = Batching.of(job.batching, task_encoding, max_tokens=budget)  # the run's own cut
    per_row = len(sizes) / max(counts.sampled_rows, 1)
    window = max(1, round(job.batching.window_rows * per_row))
    rng = np.random.default_rng(SEED)
    real = padded = cut = 0
    draws = max(1, min(8, math.ceil(counts.rows * per_row / window)))
    for _ in range(draws):
        drawn = rng.choice(sizes, size=window, replace=True)
        batches = policy.cut(drawn)
        real, cut = real + int(drawn.sum()), cut + len(batches)
        padded += padded_tokens(drawn, batches)
    efficiency = real / padded if padded else 1.0
    estimated = tokens(counts, fraction)["value"] / efficiency if efficiency else 0
    return {
        "padded_tokens": round(estimated),
        "batches": round(cut / draws * counts.rows * per_row / window),
        "efficiency": round(efficiency, 4),
        "exact": False,
    }
