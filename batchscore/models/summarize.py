"""The summarize task, extractive: the k most central, least redundant sentences of each document.

Every sentence of every document in a window is one unit for the sampler, so sentences are
batched by length across documents. Selection is maximal marginal relevance over centrality
(similarity to the document's mean sentence), and the chosen sentences keep their original order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.config import ModelConfig, SummarizeConfig
from batchscore.executor import Executor
from batchscore.models.embed import Embedder, texts_of
from batchscore.models.sentences import split_sentences
from batchscore.models.text import Encoded


def select_sentences(vectors: np.ndarray, k: int, diversity: float) -> list[int]:
    """Indices (ascending) of the k sentences to keep, from unit-length sentence vectors."""
    n = len(vectors)
    if n <= k:
        return list(range(n))
    similarity = vectors @ vectors.T
    centrality = similarity.mean(axis=1)
    redundancy = np.zeros(n, dtype=np.float32)
    chosen: list[int] = []
    for _ in range(k):
        score = (1 - diversity) * centrality - diversity * redundancy
        score[chosen] = -np.inf
        pick = int(np.argmax(score))
        chosen.append(pick)
        redundancy = np.maximum(redundancy, similarity[pick])
    return sorted(chosen)


class SummarizeTask:
    """summarize: one extractive `summary` (string) per row."""

    def __init__(
        self, path: Path, model: ModelConfig, options: SummarizeConfig, executor: Executor
    ) -> None:
        self.embedder = Embedder(path, model, executor, normalize=True)
        self.max_length = self.embedder.encoder.max_length
        self.options = options
        self.columns = [pa.field("summary", pa.string())]

    def encode(self, column: pa.ChunkedArray, name: str) -> Encoded:
        sentences: list[str] = []
        owners: list[int] = []
        for row, text in enumerate(texts_of(column, name)):
            parts = split_sentences(text)[: self.options.max_sentences]
            sentences += parts
            owners += [row] * len(parts)
        encoded = self.embedder.encoder.encode(sentences)
        encoded.owners = np.asarray(owners, dtype=np.int64)
        encoded.extra.update(sentences=sentences, rows=len(column))
        return encoded

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.embedder.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        sentences, k = encoded.extra["sentences"], self.options.sentences
        bounds = np.searchsorted(encoded.owners, np.arange(encoded.extra["rows"] + 1))
        summaries = []
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            keep = select_sentences(results[start:stop], k, self.options.diversity)
            summaries.append(" ".join(sentences[start + i] for i in keep))
        return {"summary": pa.array(summaries, type=pa.string())}
