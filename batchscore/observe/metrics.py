"""Prometheus textfile metrics for a run, for node_exporter's textfile collector.

Written at the end of every run, whatever its outcome, atomically (temp file, fsync, rename
in the same folder), so the collector never reads half a file. The last success time comes
from the output's run reports, so it survives failed runs, lost metrics files and new hosts:
alert on ``time() - batchscore_last_success_timestamp_seconds``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from batchscore.errors import write_error

# name -> (type, help, the report key it reads)
METRICS = {
    "batchscore_rows": ("gauge", "Rows scored by the last run.", "rows"),
    "batchscore_tokens": ("gauge", "Real (unpadded) tokens of the last run.", "tokens"),
    "batchscore_filtered_rows": ("gauge", "Input rows [input].where dropped.", "filtered"),
    "batchscore_bad_rows": ("gauge", "Rows the last run recorded with an error.", "bad_rows"),
    "batchscore_chunks_committed": ("gauge", "Chunks the last run committed.", "chunks_committed"),
    "batchscore_run_duration_seconds": ("gauge", "Wall time of the last run.", "wall_s"),
    "batchscore_padding_efficiency": ("gauge", "Real / padded tokens.", "padding_efficiency"),
}


def finished_at(report: dict[str, Any]) -> float:
    return float(report.get("started", 0.0)) + float(report.get("wall_s", 0.0))


def last_success(reports: Iterable[dict[str, Any]]) -> float | None:
    """When the newest successful run ended (reports newest first), or None if none did."""
    for report in reports:
        if report.get("outcome") == "ok":
            return finished_at(report)
    return None


def label(value: str) -> str:
    """A label value escaped as the text format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(report: dict[str, Any], success_at: float | None) -> str:
    """The text format: HELP, TYPE and one sample per metric, labelled with the job."""
    job = f'{{job="{label(str(report.get("job", "")))}"}}'
    lines: list[str] = []

    def sample(name: str, kind: str, text: str, value: float) -> None:
        lines.extend(
            [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{job} {float(value)!r}"]
        )

    for name, (kind, text, key) in METRICS.items():
        sample(name, kind, text, float(report.get(key, 0) or 0))
    failed = len(report.get("failed_shards", []))
    sample("batchscore_failed_shards", "gauge", "Shards the last run could not score.", failed)
    ok = report.get("outcome") == "ok"
    sample("batchscore_last_run_success", "gauge", "1 if the last run committed every row.", ok)
    sample(
        "batchscore_last_run_timestamp_seconds",
        "gauge",
        "When the last run ended.",
        finished_at(report),
    )
    if success_at is not None:
        sample(
            "batchscore_last_success_timestamp_seconds",
            "gauge",
            "When the last successful run ended.",
            success_at,
        )
    return "\n".join(lines) + "\n"


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from exc
