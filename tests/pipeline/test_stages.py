"""Reader + tokenizer + sampler (`stages.windows`): rows that cannot be encoded under
``on_error = "fail"`` fail their own shards, and the window is tokenized again only once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore.job.parse import load_job
from batchscore.models.source.locate import locate
from batchscore.models.tasks import encoding, input_kinds
from batchscore.pipeline.stages import windows
from batchscore.work.shards import find_shards, open_shard
from batchscore.work.units import chunks_of
from tests.conftest import write_job


class Counted:
    """The job's real task encoding (MiniLM's tokenizer), counting the texts it tokenizes."""

    def __init__(self, task: Any) -> None:
        self.task, self.texts = task, 0

    def encode(self, table: pa.Table) -> Any:
        self.texts += table.num_rows
        return self.task.encode(table)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)


def test_each_failing_shard_of_a_window_fails_alone_and_its_rows_are_tokenized_twice_at_most(
    tmp_path: Path,
):
    """One window of six shards, four of them with a row the tokenizer refuses (null, empty,
    blank, invisible): each of the four fails naming its first such row, the two good ones are
    encoded, and the window's texts are tokenized at most twice (once with every shard, once
    without the failed ones), not once more per failed shard."""
    (tmp_path / "in").mkdir()
    bad = {"b": None, "c": "", "d": "   ", "e": "\u200b\ufeff"}
    for name in "abcdef":
        texts = [f"text {i} of shard {name}" for i in range(4)]
        if name in bad:
            texts[2] = bad[name]
        pq.write_table(pa.table({"text": texts}), tmp_path / f"in/{name}.parquet")
    job = load_job(
        write_job(
            tmp_path / "job.toml",
            input={"path": "in", "text": "text"},
            model={"task": "embed", "max_length": 16},
            batching={"window_rows": 100},
            output={"path": "out"},
        )
    )
    kinds = input_kinds(job.model.task, job.input, job.options)
    task = Counted(encoding(locate(job.model), model=job.model, options=job.options, inp=job.input))
    chunks = [
        c
        for s in find_shards(job.input)
        for c in chunks_of(s, open_shard(s).metadata.num_rows, 100)
    ]
    made = list(
        windows(chunks, task, inp=job.input, kinds=kinds, batching=job.batching, on_error="fail")
    )
    failed = {Path(w.parts[0].chunk.shard.path).stem: str(w.error) for w in made if w.error}
    assert sorted(failed) == sorted(bad)
    for name, message in failed.items():
        assert message.startswith(f"{tmp_path}/in/{name}.parquet: row 2, column 'text': text is")
    (encoded,) = [w for w in made if w.error is None]
    assert sorted(Path(p.chunk.shard.path).stem for p in encoded.parts) == ["a", "f"]
    assert len(encoded.encoded.lengths) == 8
    assert task.texts <= 24 + 8  # every shard's rows once, then the good shards' once more
