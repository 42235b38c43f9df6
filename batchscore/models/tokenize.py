"""Each task's encoding without its weights: what `batchscore plan` tokenizes with.

A task's `encode` is the tokenizer and the row handling around it (texts, prompts, sentences);
none of it needs the model's weights, so a dry run builds only that part here, from the same
pieces the adapters use (`TextEncoder`, `text_rows`, `Prompt`, `summary_sentences`). Each entry
must give the lengths its adapter's `encode` gives: `tests/models/test_tokenize.py` checks every
task against its loaded adapter, so an adapter that changes its encoding fails there until its
entry here follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.job.sections import Job
from batchscore.models.base import Encoded, text_rows
from batchscore.models.generate import generative_kind, is_generative, read_config
from batchscore.models.prompt import Prompt
from batchscore.models.sentences import summary_sentences
from batchscore.models.text import TextEncoder


@dataclass
class Tokenizer:
    """A task's `encode` and `bucketing`, with no model behind them (enough for the stages)."""

    job: Job
    encoder: TextEncoder | None  # None: the task has no tokens (tensor rows)
    kind: str  # "text", "sentences", "prompt" or "rows"
    reserve: int = 0  # tokens each unit grows by while scored (generated tokens)
    prompt: Prompt | None = None

    @property
    def bucketing(self) -> bool:
        return self.kind != "rows"

    def encode(self, table: pa.Table) -> Encoded:
        column = self.job.input.text
        if self.kind == "rows":  # numeric features: one unit per row, nothing to tokenize
            n = table.num_rows
            ones = np.ones(n, dtype=np.int64)
            return Encoded(ones, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64))
        if self.kind == "prompt":
            encoded = self.encoder.encode_rows(*self.prompt.render(table))
            encoded.reserve = self.reserve
            return encoded
        if self.kind == "text":
            return self.encoder.encode_rows(*text_rows(table, column))
        texts, rows, errors = text_rows(table, column)
        whole = self.job.model.long_text == "chunk"
        sentences, owners = [], []
        for position, text in enumerate(texts):
            parts = summary_sentences(text)
            parts = parts if whole else parts[: self.job.task.max_sentences]
            sentences += parts
            owners += [position] * len(parts)
        tokens = self.encoder.tokens(sentences, chunk=whole, head=0)
        encoded = tokens.encoded(rows, errors)
        encoded.owners = np.asarray(owners, dtype=np.int64)[tokens.owners]
        return encoded


def tokenizer_of(job: Job, path: Path) -> Any:
    """The job's task encoding, loading only the tokenizer (and config) from ``path``."""
    model, task = job.model, job.model.task
    trust = model.trust_remote_code
    if task == "tensor":
        return Tokenizer(job, None, "rows")
    generative = task == "generate" or (task == "summarize" and is_generative(path, trust))
    if generative:
        seq2seq = generative_kind(read_config(path, trust)) == "seq2seq"
        new_tokens = job.task.max_new_tokens
        reserve = 0 if seq2seq else new_tokens  # a decoder's new tokens share its positions
        encoder = TextEncoder(path, model.max_length, trust, reserve, not seq2seq)
        prompt = Prompt(job.task.prompt, job.input.text)
        return Tokenizer(job, encoder, "prompt", reserve=new_tokens, prompt=prompt)
    encoder = TextEncoder(path, model.max_length, trust)
    return Tokenizer(job, encoder, "sentences" if task == "summarize" else "text")
