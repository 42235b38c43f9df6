"""Prometheus textfile metrics: the text format, and real runs through the CLI, where the last
success time survives a failed run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from click.testing import CliRunner

from batchscore.cli import main
from batchscore.observe.metrics import last_success, render
from tests.conftest import ROOT
from tests.reliability import make_job

SAMPLE = re.compile(r'^(batchscore_[a-z_]+)\{job="([^"\\]|\\.)*"\} (\S+)$')


def parse(text: str) -> dict[str, float]:
    """Samples by name; every line is HELP, TYPE or a well-formed sample."""
    values = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.match(r"^# (HELP|TYPE) batchscore_[a-z_]+ \S", line), line
            continue
        match = SAMPLE.match(line)
        assert match, line
        values[match.group(1)] = float(match.group(3))
    return values


def test_text_format_and_label_escaping():
    report = {"job": 'a "b"\\c', "rows": 5, "tokens": 7, "outcome": "ok", "started": 100.0,
              "wall_s": 2.5, "failed_shards": []}  # fmt: skip
    text = render(report, 102.5)
    assert '{job="a \\"b\\"\\\\c"}' in text and text.endswith("\n")
    values = parse(text)
    assert values["batchscore_rows"] == 5 and values["batchscore_last_run_success"] == 1
    assert values["batchscore_last_success_timestamp_seconds"] == 102.5
    never = parse(render({**report, "outcome": "failed"}, None))
    assert never["batchscore_last_success_timestamp_seconds"] == 0  # so the alert fires
    assert set(never) == set(values)  # every series, whatever the outcome


def test_last_success_is_the_newest_ok_report():
    reports = [{"outcome": "failed", "started": 9, "wall_s": 1},
               {"outcome": "ok", "started": 5, "wall_s": 1},
               {"outcome": "ok", "started": 1, "wall_s": 1}]  # fmt: skip
    assert last_success(reports) == 6 and last_success(reports[:1]) is None


def test_metrics_written_each_run_and_last_success_kept(tmp_path: Path, small_corpus):
    job = make_job(tmp_path, small_corpus.slice(0, 45))
    metrics = tmp_path / "prom" / "batchscore.prom"
    metrics.parent.mkdir()
    args = ["run", str(job), "--progress", "off", "--metrics-file", str(metrics)]
    before = time.time()
    ok = CliRunner().invoke(main, ["--log-format", "json", *args])
    assert ok.exit_code == 0, ok.stderr
    first = parse(metrics.read_text())
    assert first["batchscore_rows"] == 45 and first["batchscore_last_run_success"] == 1
    assert first["batchscore_tokens"] > 0 and first["batchscore_failed_shards"] == 0
    assert before <= first["batchscore_last_success_timestamp_seconds"] <= time.time()
    finished = [json.loads(line) for line in ok.stderr.splitlines() if "run finished" in line]
    assert finished and finished[0]["report"]["rows"] == 45 and finished[0]["level"] == "info"

    shard = sorted((tmp_path / "in").glob("*.parquet"))[1]
    shard.write_bytes(b"PAR1 not parquet at all")
    failed = CliRunner().invoke(main, [*args, "--restart"])
    assert failed.exit_code == 3
    second = parse(metrics.read_text())
    assert second["batchscore_last_run_success"] == 0 and second["batchscore_failed_shards"] == 1
    assert second["batchscore_rows"] == 30
    # one report per run, even for two runs in one process within one second
    assert len(list((tmp_path / "out/_batchscore/runs").glob("*.json"))) == 2
    assert (second["batchscore_last_success_timestamp_seconds"]
            == first["batchscore_last_success_timestamp_seconds"])  # fmt: skip
    assert [p.name for p in metrics.parent.iterdir()] == ["batchscore.prom"]  # no temp left


ALERT = "time() - batchscore_last_success_timestamp_seconds > 3 * 3600"  # the README's


def alert_fires(values: dict[str, float]) -> bool:
    """The README's alert, evaluated as Prometheus would on the file's samples."""
    return time.time() - values["batchscore_last_success_timestamp_seconds"] > 3 * 3600


def test_a_job_that_never_succeeded_fires_the_alert(tmp_path: Path, small_corpus):
    """A first run that fails (a corrupt shard; then a column clash, which stops it before it
    has a record) still writes every series the alert reads."""
    assert ALERT in (ROOT / "README.md").read_text()
    job = make_job(tmp_path, small_corpus.slice(0, 45))
    sorted((tmp_path / "in").glob("*.parquet"))[0].write_bytes(b"PAR1 not parquet at all")
    metrics = tmp_path / "embed.prom"
    args = ["run", str(job), "--progress", "off", "--metrics-file", str(metrics)]
    failed = CliRunner().invoke(main, args)
    assert failed.exit_code == 3
    values = parse(metrics.read_text())
    assert values["batchscore_last_run_success"] == 0 and values["batchscore_rows"] == 30
    assert values["batchscore_last_success_timestamp_seconds"] == 0 and alert_fires(values)

    metrics.unlink()
    clash = CliRunner().invoke(main, [*args, "--set", "input.keep=['embedding']"])
    assert clash.exit_code == 2 and "embedding" in clash.stderr
    values = parse(metrics.read_text())
    assert values["batchscore_last_run_success"] == 0 and alert_fires(values)
    assert before_now(values["batchscore_last_run_timestamp_seconds"])


def before_now(stamp: float) -> bool:
    return time.time() - 60 <= stamp <= time.time()
