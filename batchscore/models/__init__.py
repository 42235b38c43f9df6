"""Model adapters, one per task, chosen from a table keyed by `[model].task`.

Every adapter has the same four members, which is all the driver knows of a model:
``columns`` (output fields), ``max_length``, ``encode(column, name) -> Encoded`` (tokenize one
window), ``forward(encoded, batch) -> ndarray`` (score one batch) and
``finish(encoded, results) -> {column: array}`` (results in input order -> output columns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from batchscore.config import ModelConfig
from batchscore.executor import Executor
from batchscore.models.embed import EmbedTask
from batchscore.models.summarize import SummarizeTask
from batchscore.models.text import Encoded


class Task(Protocol):
    columns: list[pa.Field]
    max_length: int

    def encode(self, column: pa.ChunkedArray, name: str) -> Encoded: ...
    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray: ...
    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]: ...


TASKS: dict[str, type] = {"embed": EmbedTask, "summarize": SummarizeTask}


def load_task(path: Path, model: ModelConfig, options: Any, executor: Executor) -> Task:
    """Build the adapter for the job's task around the model at ``path``."""
    return TASKS[model.task](path, model, options, executor)
