"""The Ray engine on a real local Ray instance: the same output as the local engine, resumes in
both directions, and a model actor SIGKILLed mid-job is replaced with no row lost or doubled."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from batchscore.errors import EngineError, JobError
from batchscore.job.parse import load_job
from batchscore.job.sections import RayConfig
from batchscore.recipes.run import run_job
from tests.conftest import read_output, record_of
from tests.reliability import assert_complete_and_equal, make_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray with 2 CPU slots, shared by this module's tests (starting one takes seconds).

    Workers inherit this process's environment, so PYTHONPATH makes them import this checkout.
    """
    ray = pytest.importorskip("ray")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved]))
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def ray_job(folder: Path, corpus: pa.Table, chunk_rows: int = 10) -> Path:
    job = make_job(folder, corpus, chunk_rows=chunk_rows)  # one thread per model already
    job.write_text('engine = "ray"\n' + job.read_text())
    return job


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, small_corpus) -> tuple[pa.Table, dict]:
    """The local engine's output and report for the job every test here runs."""
    job = ray_job(tmp_path_factory.mktemp("local"), small_corpus.slice(0, 120))
    report = run_job(load_job(job, ['engine="local"']))
    return read_output(job.parent / "out"), report


def test_ray_output_equals_the_local_engines(ray_instance, tmp_path, small_corpus, local_run):
    clean, local = local_run
    job = ray_job(tmp_path, small_corpus.slice(0, 120))
    report = run_job(load_job(job))
    assert_complete_and_equal(job.parent / "out", clean)
    assert report["engine"] == "ray" and report["replicas"] == 2
    assert "x 2 ray actors" in report["device"]
    # the counters add up across actors to what one local model counts
    for key in ("rows", "units", "tokens", "padded_tokens", "batches", "chunks_committed"):
        assert report[key] == local[key], key
    assert report["padding_efficiency"] == local["padding_efficiency"]
    assert 0 < report["model_busy_share"] <= 1


def test_either_engine_resumes_the_others_run(ray_instance, tmp_path, small_corpus, local_run):
    clean, _ = local_run
    job = ray_job(tmp_path, small_corpus.slice(0, 120))
    out = job.parent / "out"
    run_job(load_job(job, ['engine="local"']))
    lost = [record_of(out, shard, chunk) for shard, chunk in ((0, 1), (1, 0), (2, 3))]
    for record in lost:  # as if the local run had been killed before recording these
        record.unlink()
    resumed = run_job(load_job(job))
    assert resumed["chunks_committed"] == 3 and resumed["chunks_already_done"] == 9
    assert_complete_and_equal(job.parent / "out", clean)
    for record in [record_of(out, 0, 0), record_of(out, 2, 2)]:
        record.unlink()
    again = run_job(load_job(job, ['engine="local"']))
    assert again["chunks_committed"] == 2 and again["rows"] == 20
    assert_complete_and_equal(job.parent / "out", clean)


def actor_pids() -> list[int]:
    """Processes below this one whose title Ray set to the model actor's class."""
    children: dict[int, list[int]] = {}
    titles: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            titles[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    below, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    return [pid for pid in below if "ChunkActor" in titles.get(pid, "")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds actors through /proc")
def test_killed_actor_is_replaced_and_nothing_is_lost(
    ray_instance, tmp_path, small_corpus, local_run
):
    clean, _ = local_run  # the same rows, cut into larger chunks
    job = ray_job(tmp_path, small_corpus.slice(0, 120), chunk_rows=5)
    done = job.parent / "out/_batchscore/done"
    result: dict = {}

    def run() -> None:
        try:
            result["report"] = run_job(load_job(job))
        except BaseException as exc:  # handed to the test's thread
            result["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.time() + 300
    while len(list(done.glob("*.json"))) < 3:
        assert runner.is_alive() and time.time() < deadline, result
        time.sleep(0.02)
    victims = actor_pids()
    assert victims, "no model actor process found"
    os.kill(victims[0], signal.SIGKILL)
    committed_at_kill = len(list(done.glob("*.json")))
    runner.join(timeout=300)
    assert "error" not in result, result.get("error")
    assert committed_at_kill < 24, "the job ended before the kill landed"
    report = result["report"]
    assert report["actors_replaced"] >= 1
    assert report["chunks_committed"] == 24 and report["rows"] == 120
    assert_complete_and_equal(job.parent / "out", clean)


def test_placement_follows_the_cluster():
    from batchscore.engines.ray import place

    cpus = {"CPU": 8.0}
    assert place(RayConfig(), "auto", cpus, chunks=100).actors == 8
    assert place(RayConfig(num_cpus=2.0), "auto", cpus, chunks=100).actors == 4
    assert place(RayConfig(), "auto", cpus, chunks=3).actors == 3  # no idle actors
    gpus = {"CPU": 32.0, "GPU": 4.0}
    assert (place(RayConfig(), "auto", gpus, 100).actors, place(RayConfig(), "auto", gpus, 100)
            .num_gpus) == (4, 1.0)  # fmt: skip
    assert place(RayConfig(), "cpu", gpus, 100).num_gpus == 0.0
    assert place(RayConfig(actors=2, num_gpus=0.5), "auto", gpus, 100).actors == 2
    with pytest.raises(EngineError, match="needs 1 CPU and 1 GPU, but the cluster has 8 CPU and 0"):
        place(RayConfig(num_gpus=1.0), "auto", cpus, 100)


def test_without_ray_the_message_names_the_extra(monkeypatch, embed_job: Path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    extra = r'needs Ray, an optional extra: pip install "batchscore\[ray\]"'
    with pytest.raises(JobError, match=extra):
        run_job(load_job(embed_job, ['engine="ray"']))
