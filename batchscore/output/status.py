"""`batchscore status`: done, pending and failed work per shard, from commit records and footers.

Nothing is scored and no model is loaded. Each committed data file is checked against its
record (size and Parquet footer, never its data), so a missing or damaged file shows here, and
the output of a shard that left the input is listed as gone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from batchscore.errors import BatchscoreError
from batchscore.job.sections import Job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.layout import shard_of
from batchscore.output.manifest import problems
from batchscore.output.pending import chunks_of
from batchscore.pipeline.shards import find_shards, open_shard


@dataclass
class ShardStatus:
    shard: str
    state: str  # done | pending | partial | failed | changed | missing | damaged | gone
    chunks_done: int
    chunks: int
    rows_done: int  # input rows of committed chunks
    rows: int
    bad_rows: int
    rows_written: int  # output rows: rows_done less those `[input].where` dropped
    problems: list[str] = field(default_factory=list)  # committed files no longer as written


def job_status(job: Job) -> dict[str, Any]:
    """Per-shard progress plus the last run's report, as plain data."""
    ckpt = Checkpoint(job.output.path)
    committed = ckpt.committed()
    damaged = problems(ckpt.store, committed)
    last = last_report(ckpt)
    failed = {f["shard"] for f in last.get("failed_shards", [])} if last else set()
    shards, live = [], set()
    for shard in find_shards(job.input):
        live.add(shard.key)
        records = [r for key, r in committed.items() if shard_of(key) == shard.key]
        try:
            rows = open_shard(shard).metadata.num_rows
            chunks = len(chunks_of(shard, rows, job.output.chunk_rows))
        except BatchscoreError:
            rows, chunks = 0, 0
        status = shard_status(shard.path, records, damaged, rows=rows, chunks=chunks)
        valid = [r for r in records if r["shard"] == shard.identity and r["chunk"] not in damaged]
        if not status.problems:  # a missing or damaged file says so, whatever else holds
            if len(valid) < len(records):
                status.state = "changed"
            elif shard.path in failed:
                status.state = "failed"
            elif chunks and len(valid) == chunks:
                status.state = "done"
            else:
                status.state = "partial" if valid else "pending"
        shards.append(status)
    left: dict[str, list[dict[str, Any]]] = {}
    for key, record in committed.items():
        if shard_of(key) not in live:
            left.setdefault(record["shard"]["path"], []).append(record)
    for path, records in sorted(left.items()):
        shards.append(shard_status(path, records, damaged, gone=True))
    current = [s for s in shards if s.state != "gone"]
    return {
        "job": job.name,
        "output": job.output.path,
        "shards": [asdict(s) for s in shards],
        "rows": sum(s.rows for s in current),
        "rows_done": sum(s.rows_done for s in current),
        "bad_rows": sum(s.bad_rows for s in current),
        "rows_written": sum(s.rows_written for s in current),
        "complete": all(s.state == "done" for s in current) and not ckpt.damaged,
        "damaged_bookkeeping": sorted(ckpt.damaged.values()),
        "last_run": last,
    }


def shard_status(
    path: str,
    records: list[dict[str, Any]],
    damaged: dict[str, str],
    *,
    rows: int = 0,
    chunks: int = 0,
    gone: bool = False,
) -> ShardStatus:
    """A shard's committed work; its state is "gone" (no longer input, output kept), or a
    missing or damaged file's, or left for the caller to decide ("pending")."""
    intact = [r for r in records if r["chunk"] not in damaged]
    issues = [f"{r['file']}: {damaged[r['chunk']]}" for r in records if r["chunk"] in damaged]
    state = "gone" if gone else "pending"
    if issues and not gone:
        state = "missing" if all(i.endswith(": missing") for i in issues) else "damaged"
    done_rows = sum(r["stop"] - r["start"] for r in intact)
    if gone:
        rows, chunks = done_rows, records[0]["chunks"]
    return ShardStatus(
        path,
        state,
        len(intact),
        chunks,
        done_rows,
        rows,
        sum(r.get("bad_rows", 0) for r in intact),
        sum(r["rows"] for r in intact),
        issues,
    )


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
        lines += [f"{'':<8} {'':>9} {'':>21}    {problem}" for problem in s["problems"]]
    bad = f", {status['bad_rows']:,} of them with an error" if status["bad_rows"] else ""
    dropped = status["rows_done"] - status["rows_written"]
    if dropped:
        bad += f"; {status['rows_written']:,} written, {dropped:,} dropped by [input].where"
    lines.append(
        f"{status['rows_done']:,} of {status['rows']:,} rows committed{bad}"
        + (" - complete" if status["complete"] else "")
    )
    lines += [f"{problem}; the next run scores its chunk again" for problem in status[
        "damaged_bookkeeping"]]  # fmt: skip
    gone = [s for s in status["shards"] if s["state"] == "gone"]
    if gone:
        kept = sum(s["rows_written"] for s in gone)
        lines.append(
            f"{len(gone)} shard(s) no longer input: their output ({kept:,} rows) is kept; "
            "run with --restart to rebuild the output from the current input"
        )
    last = status["last_run"]
    if last:
        lines.append(
            f"last run: {last['rows']:,} rows in {last['wall_s']:.1f} s "
            f"({last['rows_per_s']:,.1f} rows/s, {last['tokens_per_s']:,.0f} tokens/s)"
        )
    return "\n".join(lines)
