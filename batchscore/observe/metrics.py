"""Prometheus textfile metrics for a run, for node_exporter's textfile collector.

The text format is prometheus_client's (`generate_latest`). The file is written here rather
than by its `write_to_textfile`, which renames its temp file into place without an fsync: after
a power cut the name could point at an empty file. Here it is atomic and durable (temp file,
fsync, rename in the same folder, the folder fsynced), so the collector never reads half a
file. A textfile folder is often writable by a group, and the job is often root's cron: so the
temporary file is made new at an unguessable name, never through a link or a file someone
planted there (`batchscore.files.replace_durably`). prometheus_client is imported when metrics
are written (about 60 ms), never by ``import batchscore``.

Written at the end of every run, whatever its outcome. The last success time comes from the
output's run reports, so it survives failed runs, lost metrics files and new hosts; a job that
has never succeeded says 0, so alerting on ``time() -
batchscore_last_success_timestamp_seconds`` fires for it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from batchscore.errors import write_error
from batchscore.files import replace_durably

# name -> (help, the report key it reads); every one is a gauge labelled with the job's name
METRICS = {
    "batchscore_rows": ("Rows scored by the last run.", "rows"),
    "batchscore_tokens": ("Real (unpadded) tokens of the last run.", "tokens"),
    "batchscore_filtered_rows": ("Input rows [input].where dropped.", "filtered"),
    "batchscore_bad_rows": ("Rows the last run recorded with an error.", "bad_rows"),
    "batchscore_chunks_committed": ("Chunks the last run committed.", "chunks_committed"),
    "batchscore_run_duration_seconds": ("Wall time of the last run.", "wall_s"),
    "batchscore_padding_efficiency": ("Real / padded tokens.", "padding_efficiency"),
}
HELP = {
    **{name: text for name, (text, _) in METRICS.items()},
    "batchscore_failed_shards": "Shards the last run could not score.",
    "batchscore_last_run_success": "1 if the last run committed every row.",
    "batchscore_last_run_timestamp_seconds": "When the last run ended.",
    "batchscore_last_success_timestamp_seconds": (
        "When the last successful run ended; 0 if none has."
    ),
}


def finished_at(report: dict[str, Any]) -> float:
    return float(report.get("started", 0.0)) + float(report.get("wall_s", 0.0))


def last_success(reports: Iterable[dict[str, Any]]) -> float | None:
    """When the newest successful run ended (reports newest first), or None if none did."""
    for report in reports:
        if report.get("outcome") == "ok":
            return finished_at(report)
    return None


def render(report: dict[str, Any], success_at: float | None) -> str:
    """The text format, by prometheus_client: HELP, TYPE and one sample per metric, labelled
    with the job. Every series the README's alerts read is there whatever the outcome: a job
    that has never succeeded has its last success at 0, so ``time() - ...`` fires for it."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    job = str(report.get("job", ""))
    ok = report.get("outcome") == "ok"
    values = {name: float(report.get(key, 0) or 0) for name, (_, key) in METRICS.items()}
    values |= {
        "batchscore_failed_shards": len(report.get("failed_shards", [])),
        "batchscore_last_run_success": float(ok),
        "batchscore_last_run_timestamp_seconds": finished_at(report),
        "batchscore_last_success_timestamp_seconds": success_at or 0.0,
    }
    registry = CollectorRegistry()  # this run's own: nothing else in the process is exported
    for name, value in values.items():
        Gauge(name, HELP[name], ["job"], registry=registry).labels(job).set(value)
    return generate_latest(registry).decode("utf-8")


def write_metrics(path: Path, report: dict[str, Any], earlier: Iterable[dict[str, Any]]) -> None:
    """Write the run's metrics to ``path`` atomically; a failure is a `WriteError`.

    ``earlier``: the output's run reports, newest first (read only when this run failed, for
    the last success time).
    """
    success_at = finished_at(report) if report.get("outcome") == "ok" else None
    if success_at is None:
        with contextlib.suppress(OSError, ValueError):
            success_at = last_success(earlier)
    text = render(report, success_at)
    try:
        replace_durably(path, text.encode("utf-8"))
    except OSError as exc:
        raise write_error(path, exc) from exc
