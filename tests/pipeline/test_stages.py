"""Windows: rows gather across chunks and shards, up to a row count and a chunk count."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from batchscore.job.load import load_job
from batchscore.models.locate import locate
from batchscore.models.tasks import encoding
from batchscore.output.pending import chunks_of
from batchscore.pipeline.shards import find_shards
from batchscore.pipeline.stages import WINDOW_CHUNKS, windows
from tests.conftest import write_job


def test_one_row_shards_share_windows_of_at_most_window_chunks(tmp_path: Path, small_corpus):
    """Many small shards sort and batch together, but a window stops at `WINDOW_CHUNKS` chunks
    so that its chunks commit while the model scores the next one."""
    count = 2 * WINDOW_CHUNKS + 3
    (tmp_path / "in").mkdir()
    for i in range(count):
        pq.write_table(
            small_corpus.slice(i % small_corpus.num_rows, 1), tmp_path / f"in/{i:05d}.parquet"
        )
    path = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "precision": "fp32"},
        output={"path": "out"},
    )
    job = load_job(path)
    chunks = [chunks_of(shard, 1, job.output.chunk_rows)[0] for shard in find_shards(job.input)]
    task = encoding(locate(job.model), model=job.model, options=job.task, inp=job.input)
    cut = list(windows(job, chunks, task))
    assert [len(w.parts) for w in cut] == [WINDOW_CHUNKS, WINDOW_CHUNKS, 3]
    assert [p.chunk for w in cut for p in w.parts] == chunks  # every chunk once, in order
