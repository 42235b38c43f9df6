"""The numbers behind the report page (`batchscore report`, and its ``--json``), derived from
a run report and the job's status: pure functions of plain data, so the page and scripts agree.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from batchscore.observe.phases import PHASES

HISTOGRAM_BINS = 64  # at most, for the token-length histogram
BUCKETS = 12  # at most, for padding efficiency per bucket of batch widths
KEY_FIGURES = (
    "rows",
    "tokens",
    "padded_tokens",
    "padding_efficiency",
    "rows_per_s",
    "tokens_per_s",
    "generated_tokens",
    "generated_tokens_per_s",
    "wall_s",
    "load_s",
    "tuning_s",
    "model_busy_share",
    "batches",
    "duplicates",
    "from_gate",
    "truncated",
    "filtered",
    "bad_rows",
    "chunks_committed",
    "chunks_already_done",
    "rows_already_done",
    "precision",
    "device",
    "engine",
    "outcome",
    "run_id",
    "version",
)


def histogram(lengths: list[list[int]]) -> dict[str, Any]:
    """Units per token length, in at most `HISTOGRAM_BINS` equal bins: ``edges`` (n + 1) and
    ``counts`` (n)."""
    if not lengths:
        return {"edges": [], "counts": []}
    longest = max(length for length, _ in lengths)
    width = max(1, math.ceil((longest + 1) / HISTOGRAM_BINS))
    bins = longest // width + 1
    counts = [0] * bins
    for length, count in lengths:
        counts[length // width] += count
    return {"edges": [i * width for i in range(bins + 1)], "counts": counts}


def cuts(batches: list[list[int]]) -> list[dict[str, int]]:
    """The sampler's cuts: each batch width (padded length) it chose, with how many batches."""
    return [{"width": w, "batches": b} for w, b, _, _ in batches]


def buckets(batches: list[list[int]]) -> list[dict[str, Any]]:
    """Padding efficiency per bucket of batch widths: real / padded tokens of its batches."""
    if not batches:
        return []
    widest = max(w for w, *_ in batches)
    span = max(1, math.ceil(widest / BUCKETS))
    grouped: dict[int, list[int]] = {}
    for width, count, rows, tokens in batches:
        entry = grouped.setdefault((width - 1) // span, [0, 0, 0, 0])
        entry[0] += count
        entry[1] += rows
        entry[2] += tokens
        entry[3] += rows * width  # every row of the batch is padded to its width
    return [
        {
            "from": key * span + 1,
            "to": (key + 1) * span,
            "batches": count,
            "rows": rows,
            "tokens": tokens,
            "padded_tokens": padded,
            "padding_efficiency": round(tokens / padded, 4) if padded else 1.0,
        }
        for key, (count, rows, tokens, padded) in sorted(grouped.items())
    ]


def rates(timeline: dict[str, list[float]], replicas: int = 1) -> list[dict[str, float]]:
    """Throughput and model-busy share between consecutive timeline points."""
    t = timeline.get("t", [])
    points = []
    for i in range(1, len(t)):
        dt = t[i] - t[i - 1]
        if dt <= 0:
            continue
        busy = (timeline["busy_s"][i] - timeline["busy_s"][i - 1]) / dt / max(replicas, 1)
        points.append(
            {
                "t": t[i],
                "rows_per_s": round((timeline["rows"][i] - timeline["rows"][i - 1]) / dt, 2),
                "tokens_per_s": round((timeline["tokens"][i] - timeline["tokens"][i - 1]) / dt, 1),
                "model_busy": round(min(max(busy, 0.0), 1.0), 4),
            }
        )
    return points


def shards(report: dict[str, Any], status: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shard: output rows committed by this run and before it, bad rows, and a failure."""
    this_run = report.get("shards", {})
    failed = {f["shard"]: f["error"] for f in report.get("failed_shards", [])}
    found = []
    for s in status.get("shards", []):
        now = this_run.get(s["shard"], {}).get("rows", 0)
        found.append(
            {
                "shard": s["shard"],
                "state": s["state"],
                "input_rows": s["rows"],
                "this_run": now,
                "earlier": max(s["rows_written"] - now, 0),
                "bad_rows": s["bad_rows"],
                "error": failed.get(s["shard"]),
            }
        )
    return found


def phases(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's wall time by phase, in order (`batchscore.observe.phases`), start-up first:
    what a first run on a fresh machine spent measuring shows beside what it spent scoring."""
    spent = report.get("phases") or {}
    return [{"phase": name, "seconds": spent[name]} for name in PHASES if name in spent]


def pick_run(reports: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The run to report (reports newest first): the newest that scored rows or failed, since a
    run that found everything committed has nothing to draw; else the newest."""
    newest = None
    for report in reports:
        newest = newest or report
        if report.get("rows") or report.get("failed_shards") or report.get("outcome") != "ok":
            return report
    return newest


def page_numbers(report: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """Everything the report page shows, as plain data (what ``batchscore report --json``
    prints)."""
    shape = report.get("shape") or {}
    started = report.get("started")
    return {
        "job": report.get("job"),
        "output": report.get("output"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if started
        else None,
        "figures": {k: report[k] for k in KEY_FIGURES if k in report},
        "int8": report.get("int8"),
        "settled": report.get("settled"),
        "histogram": histogram(shape.get("lengths", [])),
        "cuts": cuts(shape.get("batches", [])),
        "buckets": buckets(shape.get("batches", [])),
        "timeline": rates(report.get("timeline", {}), report.get("replicas", 1)),
        "phases": phases(report),
        "shards": shards(report, status),
        "failures": report.get("failed_shards", []),
        # what the run's report does not hold at all (a report from before it was recorded),
        # as against what it holds empty: the page says which
        "unrecorded": [key for key in RECORDED if key not in report],
    }


RECORDED = ("shape", "timeline", "phases")  # the run report's keys the charts are drawn from
