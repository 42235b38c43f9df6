"""The README's cron line, as printed: three runs (the first, one with nothing to do, one
that meets a corrupt shard) append to one log file, and every line of it is one JSON object;
the metrics file is what the README's alert reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def cron_command() -> str:
    """The command of the README's crontab line (after its five time fields)."""
    (line,) = [line for line in README.splitlines() if line.startswith("15 * * * *")]
    return line.split(None, 5)[5]


def metrics(path: Path) -> dict[str, float]:
    """Samples by name, as Prometheus parses the file."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def test_the_readme_cron_line_logs_json_lines_only(tmp_path: Path, small_corpus: pa.Table):
    srv, log_dir, prom_dir = tmp_path / "srv", tmp_path / "log", tmp_path / "textfile"
    for folder in (srv / "jobs", srv / "data" / "docs", srv / ".venv" / "bin", log_dir, prom_dir):
        folder.mkdir(parents=True)
    for i in range(2):
        pq.write_table(small_corpus.slice(20 * i, 20), srv / "data" / "docs" / f"docs-{i}.parquet")
    (srv / "jobs" / "embed.toml").write_text(
        'name = "embed-docs"\n'
        '[input]\npath = "../data/docs"\ntext = "text"\nid = "doc_id"\n'
        '[model]\ntask = "embed"\nmax_length = 64\nthreads = 1\nprecision = "fp32"\n'
        "[batching]\nmax_tokens = 2048\n"
        '[output]\npath = "../out/embed"\n'
    )
    shim = srv / ".venv" / "bin" / "batchscore"  # the installed entry point, run from this tree
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m batchscore "$@"\n')
    shim.chmod(0o755)
    command = (
        cron_command()
        .replace("/srv/batchscore", str(srv))
        .replace("/var/lib/node_exporter/textfile", str(prom_dir))
        .replace("/var/log/batchscore", str(log_dir))
    )
    assert "--log-format json" in command and ">>" in command and "2>&1" in command
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def cron() -> int:
        return subprocess.run(["sh", "-c", command], env=env, timeout=300).returncode

    started = time.time()
    assert cron() == 0
    assert cron() == 0  # nothing to do
    (srv / "data" / "docs" / "docs-2.parquet").write_bytes(b"PAR1 not parquet at all")
    assert cron() == 3

    (log,) = log_dir.iterdir()
    entries = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    summaries = [e for e in entries if e.get("event") == "summary"]
    assert [s["rows"] for s in summaries] == [40, 0]
    assert [s["nothing_to_do"] for s in summaries] == [False, True]
    ending = entries[-1]  # the last line: the error the run exited with
    assert ending["level"] == "error" and ending["exit_code"] == 3
    assert "docs-2.parquet" in ending["message"]

    (prom,) = prom_dir.iterdir()
    assert prom.name == "embed-docs.prom"
    values = metrics(prom)
    assert values["batchscore_last_run_success"] == 0 and values["batchscore_failed_shards"] == 1
    alert = re.search(r"`(time\(\) - batchscore_last_success_timestamp_seconds > .*?)`", README)
    assert alert and alert.group(1).endswith("> 3 * 3600")
    assert started <= values["batchscore_last_success_timestamp_seconds"] <= time.time()
    assert not time.time() - values["batchscore_last_success_timestamp_seconds"] > 3 * 3600
