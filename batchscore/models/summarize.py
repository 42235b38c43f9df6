"""The summarize task, extractive: the k most central, least redundant sentences of each document.

(A generative `[model].path` makes summaries abstractive instead: see `generate.py`.)

Sentences are those of the document's prose (`text.sentences.summary_sentences`: no headings, code
or link targets). Every sentence of every document in a window is one unit for the sampler, so
sentences are batched by length across documents. Selection is maximal marginal relevance over
centrality (similarity to the document's mean sentence), and the chosen sentences keep their
original order.
With `[model].long_text = "chunk"` the whole document is ranked (`max_sentences` applies to
"truncate" only) and a sentence longer than the model's window is embedded whole, from windows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig, SummarizeConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields
from batchscore.models.generation.architecture import is_generative
from batchscore.models.stack.embedder import Embedder, check_stack_files, refuse_sparse
from batchscore.models.stack.stack import stack_parts
from batchscore.models.stack.stack_text import StackText
from batchscore.models.text.inputs import Prompt, text_rows
from batchscore.models.text.sentences import summary_sentences
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded


def select_sentences(vectors: np.ndarray, k: int, diversity: float) -> list[int]:
    """Indices (ascending) of the k sentences to keep, from unit-length sentence vectors.

    Never forms the sentences' similarity matrix: centrality is each sentence's similarity to
    the mean sentence, and redundancy grows one chosen row at a time, so a whole long document
    costs memory in proportion to its sentences, not their square.
    """
    n = len(vectors)
    if n <= k:
        return list(range(n))
    centrality = vectors @ vectors.mean(axis=0)
    redundancy = np.zeros(n, dtype=np.float32)
    chosen: list[int] = []
    for _ in range(k):
        score = (1 - diversity) * centrality - diversity * redundancy
        score[chosen] = -np.inf
        pick = int(np.argmax(score))
        chosen.append(pick)
        redundancy = np.maximum(redundancy, vectors @ vectors[pick])
    return sorted(chosen)


class SentencesEncoding:
    """Extractive summarize's encoding: units are a document's sentences (or a long sentence's
    windows), each owned by its row, read as the encoder's stack reads texts."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: SummarizeConfig, inp: InputConfig
    ) -> None:
        self.text = StackText(path, model)
        self.max_sentences = options.max_sentences
        self.whole = model.long_text == "chunk"
        self.inputs = (inp.text,)

    def encode(self, table: pa.Table) -> Encoded:
        """Units are sentences (or a long sentence's windows); each unit's owner is its row."""
        texts, rows, errors = text_rows(table, self.inputs[0])
        sentences: list[str] = []
        documents: list[int] = []  # sentence -> its document (position in `texts`)
        for position, text in enumerate(texts):
            parts = summary_sentences(text)
            if not self.whole:
                parts = parts[: self.max_sentences]
            sentences += parts
            documents += [position] * len(parts)
        tokens = self.text.tokens(sentences)
        encoded = tokens.encoded(rows, errors)
        encoded.owners = np.asarray(documents, dtype=np.int64)[tokens.owners]
        encoded.extra = {
            "sentences": sentences,
            "sentence_of": tokens.owners,
            "documents": np.asarray(documents, dtype=np.int64),
        }
        return encoded


class SummarizeTask(Adapter):
    """summarize: one extractive `summary` (string) per row; with a generative model,
    `AbstractiveSummarizeTask`'s (`batchscore.models.tasks.adapter` tells them apart)."""

    encoding_type = SentencesEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: SummarizeConfig) -> dict[str, str]:
        """The text column; or a generative model's prompt columns, when a prompt is set."""
        return {c: "text" for c in Prompt(options.prompt, inp.text).columns}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("summary",)

    @classmethod
    def check_files(cls, path: Path, options: object, *, allow_pickle: bool) -> None:
        """The encoder's stack, which must be a dense one (its vectors rank the sentences)."""
        stack = check_stack_files(path, prompt_name=None, allow_pickle=allow_pickle)
        if stack is not None and stack.sparse:
            refuse_sparse(stack)

    @classmethod
    def fingerprint_parts(cls, model: ModelConfig, path: Path, options: object) -> dict[str, str]:
        return {} if cls.generates(model, path) else stack_parts(path)

    @classmethod
    def generates(cls, model: ModelConfig, path: Path) -> bool:
        """Whether the model generates its summaries: told by its config, never its name."""
        return is_generative(path, model.trust_remote_code)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: SummarizeConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.set_up(path, model=model, options=options, inp=inp)
        self.embedder = Embedder(self.encoding.text, model, executor, normalize=True)
        self.options = options
        self.columns = fields(self.output_names(options), {"summary": pa.string()})

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.embedder.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        sentences, k = encoded.extra["sentences"], self.options.sentences
        vectors = self.embedder.combine(
            results, encoded.extra["sentence_of"], len(sentences), encoded.lengths
        )
        documents = encoded.extra["documents"]
        bounds = np.searchsorted(documents, np.arange(len(encoded.rows) + 1))
        summaries = []
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            keep = select_sentences(vectors[start:stop], k, self.options.diversity)
            summaries.append(" ".join(sentences[start + i] for i in keep))
        return {"summary": pa.array(summaries, type=pa.string())}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.texts(reference, candidate, "summary", gate)
