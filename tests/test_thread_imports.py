"""Imports never race: no two threads of batchscore import modules side by side.

transformers (like batchscore itself) imports its parts lazily, and Python hands a thread that
meets another thread's import cycle a half-initialised module: "cannot import name
'AutoConfig' from 'transformers'", at random, more often on a busy machine. The local engine's
reader thread therefore imports nothing (the task's encoding is built before it starts), and
`batchscore.run` / `batchscore.score` calls from several threads take turns.

Each check runs in a fresh process, where nothing is imported yet: a run of a tiny GPT-2
generate job, beside a process that keeps a core busy. A finder on the meta path records which
thread imports what, so the rule is checked as it is, not only by the luck of one timing.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import sample_corpus

from tests.conftest import ROOT, read_output, write_job
from tests.models import tiny

pytestmark = pytest.mark.slow
ROUNDS = 3  # fresh processes per check; before the fix most of them failed on a busy machine

# Records every module imported, as "thread<TAB>module" lines in the file argv[1] names: a
# finder first on the meta path sees each import, `importlib.import_module`'s too (the audit
# hook's "import" event misses those, which is how transformers imports its parts).
WATCH = """
import sys, threading
events = open(sys.argv[1], "w", buffering=1)
class Watch:
    @staticmethod
    def find_spec(name, path=None, target=None):
        events.write(f"{threading.current_thread().name}\\t{name}\\n")
sys.meta_path.insert(0, Watch)
"""

# `batchscore run ARGS...`.
CLI = """
from batchscore.cli import main
sys.argv = ["batchscore", *sys.argv[2:]]
main()
"""

# One thread runs the job, another scores a frame with a second model, both at once.
TWO_THREADS = """
import pyarrow as pa
import batchscore
job, model = sys.argv[2], sys.argv[3]
start = threading.Barrier(2)
failed = []
def run():
    start.wait()
    try:
        batchscore.run(job, restart=True)
    except BaseException as exc:
        failed.append(repr(exc))
def score():
    start.wait()
    try:
        frame = pa.table({"text": ["the first prompt", "and a second one, longer"]})
        out = batchscore.score(frame, task="generate", model=model, precision="fp32",
                               max_new_tokens=4, max_length=32)
        assert out.column_names[:2] == ["text", "generated"], out.column_names
    except BaseException as exc:
        failed.append(repr(exc))
threads = [threading.Thread(target=run, name="runs"), threading.Thread(target=score, name="scores")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(failed)
sys.exit(1 if failed else 0)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, small_corpus: pa.Table) -> dict[str, Path]:
    """A tiny GPT-2 and a tiny T5 (random weights), built once for the module."""
    texts = small_corpus.column("text").to_pylist()
    return {
        "gpt2": tiny.gpt2(tmp_path_factory.mktemp("gpt2"), texts),
        "t5": tiny.t5(tmp_path_factory.mktemp("t5"), texts),
    }


def generate_job(folder: Path, corpus: pa.Table, model: Path) -> Path:
    """A 60-row generate job over 2 shards, in fp32 (so the model loads while the reader reads:
    no quality gate loads it first)."""
    sample_corpus.write_shards(corpus.slice(0, 60), folder / "in", shards=2, row_group_size=20)
    return write_job(
        folder / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "generate", "path": str(model), "max_length": 32, "threads": 1},
        generate={"max_new_tokens": 4},
        output={"path": "out"},
    )


@pytest.fixture
def busy() -> Iterator[None]:
    """A process that keeps one core busy for the length of the test."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    burner.kill()
    burner.wait()


def watched(code: str, events: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python, its imports written to ``events``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", WATCH + code, str(events), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def imports(events: Path) -> list[tuple[str, str]]:
    """(thread, module) for every import the process made, in order."""
    return [tuple(line.split("\t", 1)) for line in events.read_text().splitlines()]


def test_a_generate_job_on_a_busy_machine_imports_on_one_thread(
    tmp_path: Path, small_corpus: pa.Table, models: dict[str, Path], busy: None
):
    """Each run exits 0 with every row, and the reader and writer threads import nothing: what
    they run was imported before they started, whatever the timing."""
    job = generate_job(tmp_path, small_corpus, models["gpt2"])
    for round in range(ROUNDS):
        events = tmp_path / f"imports-{round}.txt"
        done = watched(CLI, events, "run", str(job), "--restart")
        assert done.returncode == 0, done.stderr[-3000:]
        assert read_output(tmp_path / "out").num_rows == 60
        seen = imports(events)
        assert any(module == "transformers" for _, module in seen)  # the hook saw the load
        off_main = [(t, m) for t, m in seen if t != "MainThread"]
        assert off_main == [], off_main[:20]


def test_run_and_score_from_two_threads_take_turns(
    tmp_path: Path, small_corpus: pa.Table, models: dict[str, Path], busy: None
):
    """`batchscore.run` (GPT-2) and `batchscore.score` (T5) started at once in a fresh process:
    both succeed, and transformers' modules are imported by one call, then by the other,
    never interleaved."""
    job = generate_job(tmp_path, small_corpus, models["gpt2"])
    for round in range(ROUNDS):
        events = tmp_path / f"imports-{round}.txt"
        done = watched(TWO_THREADS, events, str(job), str(models["t5"]))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        order = [t for t, m in imports(events) if m.split(".")[0] == "transformers"]
        turns = [t for i, t in enumerate(order) if i == 0 or order[i - 1] != t]
        assert set(order) == {"runs", "scores"}  # both loaded models of their own ...
        assert len(turns) == 2, collections.Counter(turns)  # ... one after the other
