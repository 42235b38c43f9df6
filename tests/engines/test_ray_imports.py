"""The Ray engine's model actor loads and scores on one thread.

Ray runs an actor's methods one at a time, on its worker's main thread, so the modules the model
and its scoring import (transformers imports its parts lazily) are never imported from two
threads at once, where one could meet the other's half-initialised modules. A watched actor
records which thread imports what while it loads a tiny GPT-2 and scores a job's chunks.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import sample_corpus

from batchscore.engines import ray as ray_engine
from batchscore.engines.ray import ChunkActor
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import ROOT, read_output, write_job
from tests.models import tiny

pytestmark = pytest.mark.ray
EVENTS = "BATCHSCORE_TEST_IMPORT_EVENTS"  # the folder a watched actor writes its imports to


class WatchedActor(ChunkActor):
    """The model actor, first on its process's meta path: every import it (or anything in its
    process) makes is written as "thread<TAB>module" to a file of its own."""

    def __init__(self, *args: object) -> None:
        folder = Path(os.environ[EVENTS])
        self.events = (folder / f"{os.getpid()}.txt").open("a", buffering=1)
        sys.meta_path.insert(0, self)
        super().__init__(*args)

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        self.events.write(f"{threading.current_thread().name}\t{name}\n")


@pytest.fixture
def watched_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local Ray of 1 CPU slot whose workers import this checkout (and this test module)
    and know where to write."""
    ray = pytest.importorskip("ray")
    events = tmp_path / "imports"
    events.mkdir()
    paths = [str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]  # the module too
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    monkeypatch.setenv(EVENTS, str(events))
    monkeypatch.setattr(ray_engine, "ChunkActor", WatchedActor)
    ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
    yield events
    ray.shutdown()


def test_the_actor_imports_on_one_thread(watched_ray: Path, tmp_path: Path, small_corpus: pa.Table):
    texts = small_corpus.column("text").to_pylist()
    (tmp_path / "gpt2").mkdir()
    model = tiny.gpt2(tmp_path / "gpt2", texts)
    sample_corpus.write_shards(small_corpus.slice(0, 40), tmp_path / "in", shards=2)
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text"},
        model={"task": "generate", "path": str(model), "max_length": 32, "threads": 1},
        generate={"max_new_tokens": 4},
        ray={"actors": 1},
        output={"path": "out", "chunk_rows": 10},
    )
    job.write_text('engine = "ray"\n' + job.read_text())
    report = run_job(load_job(job))
    assert report["chunks_committed"] == 4 and read_output(tmp_path / "out").num_rows == 40
    (log,) = watched_ray.iterdir()  # one actor, never replaced
    seen = [line.split("\t", 1) for line in log.read_text().splitlines()]
    assert any(module.startswith("transformers.models.gpt2") for _, module in seen)
    assert {thread for thread, _ in seen} == {"MainThread"}
