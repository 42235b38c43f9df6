"""Prometheus textfile metrics: the text format, and real runs through the CLI, where the last
success time survives a failed run."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.observe.metrics import last_success, render, write_metrics
from tests.commands import invoke
from tests.conftest import ROOT
from tests.output.tiny import tiny_job, write_shard
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


def plant_at_temp_names(folder: Path, name: str, victim: Path, kind: str) -> list[Path]:
    """What a neighbour with write access to a shared textfile folder can plant where a run's
    temporary file would go: a symbolic link or a hard link to ``victim`` at the names this
    process (and the next PIDs) would have used."""
    planted = []
    for pid in range(os.getpid(), os.getpid() + 20):
        place = folder / f".{name}.{pid}.tmp"
        if kind == "symbolic link":
            place.symlink_to(victim)
        else:
            os.link(victim, place)
        planted.append(place)
    return planted


REPORT = {"job": "j", "rows": 5, "outcome": "ok", "started": 100.0, "wall_s": 1.0}


@pytest.mark.parametrize("kind", ["symbolic link", "hard link"])
def test_a_link_planted_at_a_temp_name_is_never_written_through(tmp_path: Path, kind: str):
    """A root cron job writes metrics into a group-writable textfile folder: a link planted
    at the temporary file's name must not make it overwrite the file the link points to."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    folder.chmod(0o2777)
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0:the file a neighbour wants overwritten\n")
    planted = plant_at_temp_names(folder, "embed.prom", victim, kind)
    metrics = folder / "embed.prom"

    write_metrics(metrics, REPORT, [])

    assert victim.read_text() == "root:x:0:0:the file a neighbour wants overwritten\n"
    assert parse(metrics.read_text())["batchscore_rows"] == 5
    assert os.stat(metrics).st_ino != os.stat(victim).st_ino
    assert all(p.is_symlink() or p.samefile(victim) for p in planted)  # left as they were
    assert set(folder.iterdir()) == {metrics, *planted}  # no temporary file left behind


def test_the_command_line_never_writes_through_a_planted_link(tmp_path: Path):
    """The issue's case end to end: ``run --metrics-file`` (here in this process, so the PIDs
    the links are planted at are the run's own)."""
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in/a.parquet", 5)
    folder = tmp_path / "textfile"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = plant_at_temp_names(folder, "job.prom", victim, "symbolic link")

    result = invoke(
        "run", str(job), "--progress", "off", "--metrics-file", str(folder / "job.prom")
    )

    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious\n" and all(p.is_symlink() for p in planted)
    assert parse((folder / "job.prom").read_text())["batchscore_rows"] == 5


def test_the_metrics_file_is_renamed_into_place_then_its_folder_fsynced(
    tmp_path: Path, monkeypatch
):
    """ "Atomic and durable": the rename itself must reach the disk, so the folder is fsynced
    after it. Watched through `os.fsync` and `os.replace`, which still do their work (a power
    cut cannot be made here)."""
    events: list[tuple[str, int]] = []
    fsync, replace = os.fsync, os.replace

    def watched_fsync(fd: int) -> None:
        info = os.fstat(fd)
        events.append(("fsync folder" if stat.S_ISDIR(info.st_mode) else "fsync file", info.st_ino))
        fsync(fd)

    def watched_replace(src, dst) -> None:
        replace(src, dst)
        events.append(("rename", os.stat(dst).st_ino))

    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(os, "replace", watched_replace)
    metrics = tmp_path / "embed.prom"
    write_metrics(metrics, REPORT, [])
    file, folder = os.stat(metrics).st_ino, os.stat(tmp_path).st_ino
    assert events == [("fsync file", file), ("rename", file), ("fsync folder", folder)]
