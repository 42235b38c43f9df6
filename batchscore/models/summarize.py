"""The summarize task, extractive: the k most central, least redundant sentences of each document.

(A generative `[model].path` makes summaries abstractive instead: see `generate.py`.)

Every sentence of every document in a window is one unit for the sampler, so sentences are
batched by length across documents. Selection is maximal marginal relevance over centrality
(similarity to the document's mean sentence), and the chosen sentences keep their original order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig, SummarizeConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Encoded, text_rows
from batchscore.models.embed import Embedder
from batchscore.models.prompt import Prompt
from batchscore.models.sentences import split_sentences
from batchscore.pipeline.executor import Executor


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

    bucketing = True

    @staticmethod
    def input_kinds(inp: InputConfig, options: SummarizeConfig) -> dict[str, str]:
        """The text column; or a generative model's prompt columns, when a prompt is set."""
        return {c: "text" for c in Prompt(options.prompt, inp.text).columns}

    @staticmethod
    def output_names(options: object) -> tuple[str, ...]:
        return ("summary",)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: SummarizeConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.embedder = Embedder(path, model, executor, normalize=True)
        self.options = options
        self.inputs = (inp.text,)
        self.columns = [pa.field("summary", pa.string())]

    def encode(self, table: pa.Table) -> Encoded:
        texts, rows, errors = text_rows(table, self.inputs[0])
        sentences: list[str] = []
        owners: list[int] = []
        for position, text in enumerate(texts):
            parts = split_sentences(text)[: self.options.max_sentences]
            sentences += parts
            owners += [position] * len(parts)
        ids, truncated = self.embedder.encoder.encode(sentences)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        owners_array = np.asarray(owners, dtype=np.int64)
        return Encoded(
            lengths, owners_array, rows, errors, ids, truncated, extra={"sentences": sentences}
        )

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.embedder.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        sentences, k = encoded.extra["sentences"], self.options.sentences
        bounds = np.searchsorted(encoded.owners, np.arange(len(encoded.rows) + 1))
        summaries = []
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            keep = select_sentences(results[start:stop], k, self.options.diversity)
            summaries.append(" ".join(sentences[start + i] for i in keep))
        return {"summary": pa.array(summaries, type=pa.string())}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.texts(reference, candidate, "summary", gate)
