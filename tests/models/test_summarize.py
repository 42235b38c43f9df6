"""Extractive summaries: sentence splitting, selection, and the task on real prose."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.job.sections import InputConfig, ModelConfig, SummarizeConfig
from batchscore.models.summarize import SummarizeTask, select_sentences
from batchscore.models.text.sentences import split_sentences, summary_sentences
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.runtime.executor import Executor


def test_split_sentences_on_prose():
    text = (
        "Return the value, e.g. an int. Mr. Smith\nwrote it!  Is it right?\n\n"
        "A new paragraph (with brackets). J. R. Tolkien agrees."
    )
    assert split_sentences(text) == [
        "Return the value, e.g. an int.",
        "Mr. Smith wrote it!",
        "Is it right?",
        "A new paragraph (with brackets).",
        "J. R. Tolkien agrees.",
    ]
    assert split_sentences("") == [] and split_sentences("no full stop") == ["no full stop"]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 12), k=st.integers(1, 5), diversity=st.floats(0, 1), seed=st.integers())
def test_selection_keeps_k_distinct_sentences_in_order(n, k, diversity, seed):
    vectors = np.random.default_rng(seed % 2**32).normal(size=(n, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-9
    chosen = select_sentences(vectors, k, diversity)
    assert chosen == sorted(set(chosen)) and len(chosen) == min(n, k)


def test_selection_prefers_central_and_avoids_duplicates():
    vectors = np.array([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0], [0.9, 0.436]], dtype=np.float32)
    assert select_sentences(vectors, 1, 0.0) == [1]  # nearest to the others on average
    duplicated = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert select_sentences(duplicated, 2, 0.0) == [0, 1]  # pure centrality takes both copies
    assert select_sentences(duplicated, 2, 0.7) == [0, 2]  # diversity skips the duplicate


@pytest.fixture(scope="module")
def task(minilm_path):
    model = ModelConfig(task="summarize", precision="fp32")
    options = SummarizeConfig(sentences=2)
    return SummarizeTask(
        minilm_path,
        model=model,
        options=options,
        inp=InputConfig(path=()),
        executor=Executor(model),
    )


def test_summaries_are_sentences_of_their_own_document(task, corpus):
    texts = [*[t for t in corpus.column("text").to_pylist() if len(t) > 400][:20], "One line."]
    encoded = task.encode(pa.table({"text": texts}))
    assert len(encoded.ids) > len(texts)  # sentences, not documents, are the units
    batches = form_batches(encoded.lengths, 4096, 64)
    results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    summaries = task.finish(encoded, results)["summary"].to_pylist()
    assert len(summaries) == len(texts)
    for text, summary in zip(texts, summaries, strict=True):
        sentences = summary_sentences(text)
        picked = list(dict.fromkeys(s for s in sentences if s in summary))
        assert 1 <= len(picked) <= 2
        assert summary == " ".join(picked)  # original order, nothing else
    assert summaries[-1] == "One line."
