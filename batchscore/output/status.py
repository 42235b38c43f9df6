"""`batchscore status`: done, pending and failed work per shard, from commit records and footers.

Nothing is scored and no model is loaded; a shard whose records all match it is not opened.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from batchscore.errors import BatchscoreError
from batchscore.job.sections import Job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.layout import shard_of
from batchscore.output.pending import chunks_of
from batchscore.pipeline.shards import find_shards, open_shard


@dataclass
class ShardStatus:
    shard: str
    state: str  # done | pending | partial | failed | changed
    chunks_done: int
    chunks: int
    rows_done: int  # input rows of committed chunks
    rows: int
    bad_rows: int
    rows_written: int  # output rows: rows_done less those `[input].where` dropped


def job_status(job: Job) -> dict[str, Any]:
    """Per-shard progress plus the last run's report, as plain data."""
    ckpt = Checkpoint(job.output.path)
    committed = ckpt.committed()
    last = last_report(ckpt)
    failed = {f["shard"] for f in last.get("failed_shards", [])} if last else set()
    shards = []
    for shard in find_shards(job.input):
        records = [r for key, r in committed.items() if shard_of(key) == shard.key]
        valid = [r for r in records if r["shard"] == shard.identity]
        try:
            pf = open_shard(shard)
            rows = pf.metadata.num_rows
            chunks = len(chunks_of(shard, rows, job.output.chunk_rows))
        except BatchscoreError:
            rows, chunks = 0, 0
        done_rows = sum(r["stop"] - r["start"] for r in valid)
        written = sum(r["rows"] for r in valid)
        if len(valid) < len(records):
            state = "changed"
        elif shard.path in failed:
            state = "failed"
        elif chunks and len(valid) == chunks:
            state = "done"
        else:
            state = "partial" if valid else "pending"
        bad = sum(r.get("bad_rows", 0) for r in valid)
        shards.append(
            ShardStatus(shard.path, state, len(valid), chunks, done_rows, rows, bad, written)
        )
    return {
        "job": job.name,
        "output": job.output.path,
        "shards": [asdict(s) for s in shards],
        "rows": sum(s.rows for s in shards),
        "rows_done": sum(s.rows_done for s in shards),
        "bad_rows": sum(s.bad_rows for s in shards),
        "rows_written": sum(s.rows_written for s in shards),
        "complete": all(s.state == "done" for s in shards),
        "last_run": last,
    }


def last_report(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The newest run report, or None before the first run."""
    return next(ckpt.reports(), None)


def format_status(status: dict[str, Any]) -> str:
    """A fixed-width table for people; `--json` gives scripts the same data."""
    lines = [f"{'state':<8} {'chunks':>9} {'rows':>21}  shard"]
    for s in status["shards"]:
        chunks = f"{s['chunks_done']}/{s['chunks']}"
        rows = f"{s['rows_done']:,}/{s['rows']:,}"
        lines.append(f"{s['state']:<8} {chunks:>9} {rows:>21}  {s['shard']}")
    bad = f", {status['bad_rows']:,} of them with an error" if status["bad_rows"] else ""
    dropped = status["rows_done"] - status["rows_written"]
    if dropped:
        bad += f"; {status['rows_written']:,} written, {dropped:,} dropped by [input].where"
    lines.append(
        f"{status['rows_done']:,} of {status['rows']:,} rows committed{bad}"
        + (" - complete" if status["complete"] else "")
    )
    last = status["last_run"]
    if last:
        lines.append(
            f"last run: {last['rows']:,} rows in {last['wall_s']:.1f} s "
            f"({last['rows_per_s']:,.1f} rows/s, {last['tokens_per_s']:,.0f} tokens/s)"
        )
    return "\n".join(lines)
