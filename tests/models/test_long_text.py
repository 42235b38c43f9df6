"""`[model].long_text = "chunk"`: long texts read whole, in windows, each task pooling them its way.

References are computed independently, row by row: windows from transformers' own tokenizer
(``return_overflowing_tokens`` with the same stride), each window alone through the model.
Run with ``-s`` to see how close windows get to reading a text whole, next to truncation.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from batchscore.job.parse import load_job
from batchscore.job.sections import (
    ClassifyConfig,
    EmbedConfig,
    InputConfig,
    ModelConfig,
    SummarizeConfig,
)
from batchscore.models.classify import ClassifyTask
from batchscore.models.embed import EmbedTask
from batchscore.models.summarize import SummarizeTask
from batchscore.models.text.windows import cut, mean_by_owner
from batchscore.observe.run_stats import summary
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job
from tests.models.st_folders import save_st, tiny_bert


@given(n=st.integers(0, 300), size=st.integers(4, 40), head=st.integers(0, 3), data=st.data())
def test_windows_cover_every_token_in_order(n, size, head, data):
    overlap = data.draw(st.integers(0, size - head - 1))
    content = np.arange(n)
    windows = cut(content, size=size, overlap=overlap, head=head)
    assert all(len(w) <= size for w in windows)
    if n <= size:
        assert len(windows) == 1 and np.array_equal(windows[0], content)
        return
    bodies = [w[head:] for w in windows]
    assert all(np.array_equal(w[:head], content[:head]) for w in windows)  # the prompt leads
    assert np.array_equal(np.unique(np.concatenate(bodies)), content[head:])  # all, once or more
    for a, b in itertools.pairwise(bodies):
        assert np.array_equal(a[len(a) - overlap :], b[:overlap])  # each repeats the last overlap
        assert len(a) == size - head  # only the last window is short


def test_mean_by_owner_leaves_single_units_untouched():
    values = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [0.1, 0.7]], dtype=np.float32)
    owners = np.array([0, 1, 1, 2])
    mean = mean_by_owner(values, owners, 3, weights=np.array([5, 3, 1, 7]))
    assert np.array_equal(mean[[0, 2]], values[[0, 3]])
    assert np.allclose(mean[1], (3 * values[1] + values[2]) / 4)


def run(task, texts: list[str], budget: int = 2048) -> tuple[dict, object]:
    """A task over ``texts`` in length-bucketed batches, as the pipeline runs it."""
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, budget, 32)
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return task.finish(encoded, results), encoded


def make(cls, path: Path, options, **model):
    config = ModelConfig(task="embed", precision="fp32", threads=1, **model)
    return cls(
        path, model=config, options=options, inp=InputConfig(path=()), executor=Executor(config)
    )


def hf_windows(path: Path, text: str, max_length: int) -> list[dict]:
    """transformers' own windows of ``text``: same size, each repeating the last eighth."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    out = tok(
        text,
        truncation=True,
        max_length=max_length,
        stride=max_length // 8,
        return_overflowing_tokens=True,
    )
    return [
        {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        }
        for ids in out["input_ids"]
    ]


@pytest.fixture(scope="module")
def long_texts(corpus) -> list[str]:
    """Real documents of 300 to 500 MiniLM tokens (so the model can also read them whole)."""
    texts = [t for t in corpus.column("text").to_pylist() if 1500 < len(t) < 2400][:24]
    return [*texts, "A short one, which fits."]


def test_embed_windows_equal_a_row_by_row_reference(minilm_path, long_texts):
    from transformers import AutoModel

    task = make(EmbedTask, minilm_path, EmbedConfig(), max_length=128, long_text="chunk")
    columns, encoded = run(task, long_texts)
    ours = np.array(columns["embedding"].to_pylist())
    assert encoded.chunked == len(long_texts) - 1 and encoded.windows > 3 * encoded.chunked
    assert (encoded.lengths == 128).mean() > 0.6  # most units are full windows: no padding
    model = AutoModel.from_pretrained(minilm_path).eval()
    expected = []
    with torch.inference_mode():
        for text in long_texts:
            vectors, weights = [], []
            for window in hf_windows(minilm_path, text, 128):
                hidden = model(**window).last_hidden_state[0]
                vectors.append(hidden.mean(0))  # MiniLM's mean pooling, before its Normalize
                weights.append(window["input_ids"].shape[1])
            mean = (torch.stack(vectors) * torch.tensor(weights)[:, None]).sum(0) / sum(weights)
            expected.append(torch.nn.functional.normalize(mean, dim=0).numpy())
    cosine = (ours * np.stack(expected)).sum(axis=1)
    print(f"\nchunked embed vs row-by-row windows: min cosine {cosine.min():.7f}")
    assert cosine.min() >= 0.9999


def test_windows_read_more_of_a_text_than_truncation(minilm_path, long_texts):
    """Against the text read whole in one 512-token window: windows of 128 stay closer to it
    than its first 128 tokens do."""
    texts = long_texts[:-1]
    whole = np.array(
        run(make(EmbedTask, minilm_path, EmbedConfig(), max_length=512), texts, 4096)[0][
            "embedding"
        ].to_pylist()
    )
    figures = {}
    for mode in ("truncate", "chunk"):
        task = make(EmbedTask, minilm_path, EmbedConfig(), max_length=128, long_text=mode)
        vectors = np.array(run(task, texts)[0]["embedding"].to_pylist())
        figures[mode] = (vectors * whole).sum(axis=1)
    print(
        f"\ncosine with the whole text (512 tokens), {len(texts)} texts of 300-500 tokens: "
        + "; ".join(f"{m} 128: mean {c.mean():.4f} min {c.min():.4f}" for m, c in figures.items())
    )
    assert figures["chunk"].mean() > figures["truncate"].mean() + 0.02
    assert (figures["chunk"] > figures["truncate"]).mean() > 0.8


def test_classify_windows_average_probabilities(bert_path, long_texts):
    from transformers import AutoModelForSequenceClassification

    options = ClassifyConfig(all_scores=True)
    task = make(ClassifyTask, bert_path, options, max_length=64, long_text="chunk")
    columns, encoded = run(task, long_texts)
    ours = np.array(columns["scores"].to_pylist())
    model = AutoModelForSequenceClassification.from_pretrained(bert_path).eval()
    with torch.inference_mode():
        expected = np.stack(
            [
                np.mean(
                    [
                        model(**w).logits.softmax(-1)[0].numpy()
                        for w in hf_windows(bert_path, text, 64)
                    ],
                    axis=0,
                )
                for text in long_texts
            ]
        )
    assert encoded.windows > 2 * len(long_texts)
    assert np.abs(ours - expected).max() < 1e-5
    assert np.allclose(columns["score"].to_numpy(), ours.max(axis=1))


def test_summaries_rank_the_whole_document(minilm_path):
    filler = [
        "The invoice was paid in March.",
        "Cats sleep for most of the day.",
        "The compiler rejects unused imports.",
        "Paris hosted the summer games in 1924.",
    ]
    theme = [
        "Rivers carry water from the mountains down to the sea.",
        "A river carries rain water from the hills to the ocean.",
        "Streams and rivers bring the water of the mountains to the sea.",
        "The water of every river ends up in the sea.",
    ]
    long_sentence = "The delta spreads " + "wide and flat and green, " * 40 + "into the sea."
    document = " ".join([*filler, *theme, long_sentence])
    picked = {}
    for mode in ("truncate", "chunk"):
        options = SummarizeConfig(sentences=2, diversity=0.0, max_sentences=4)
        task = make(SummarizeTask, minilm_path, options, max_length=32, long_text=mode)
        columns, encoded = run(task, [document])
        picked[mode] = columns["summary"][0].as_py()
        if mode == "chunk":  # every sentence ranked; the long one read in windows
            assert len(encoded.extra["sentences"]) == 9 and encoded.chunked == 1
    assert sum(s in picked["truncate"] for s in filler) == 2  # only the first 4 were ranked
    assert sum(s in picked["chunk"] for s in theme) == 2  # the theme, at the end, wins


def test_a_chunked_job_counts_its_windows_and_resumes(tmp_path, shards, minilm_path):
    model = save_st(tmp_path / "st", tiny_bert(tmp_path / "bert", minilm_path), normalize=True)
    path = write_job(
        tmp_path / "chunk.toml",
        input={"path": str(shards), "id": "doc_id"},
        model={
            "task": "embed",
            "path": str(model),
            "max_length": 32,
            "threads": 1,
            "long_text": "chunk",
        },
        batching={"max_tokens": 2048, "window_rows": 64},
        output={"path": "out", "chunk_rows": 50},
    )
    report = run_job(load_job(path))
    assert report["rows"] == 360 and report["chunked"] > 100
    assert report["windows"] > 2 * report["chunked"]
    assert report["padding_efficiency"] > 0.95  # windows are full-length units
    assert f"long texts: {report['chunked']:,} read whole as" in summary(report)
    out = read_output(tmp_path / "out")
    assert out.num_rows == 360
    assert np.allclose(np.linalg.norm(np.array(out["embedding"].to_pylist()), axis=1), 1.0)
    assert run_job(load_job(path))["rows"] == 0  # resumes: nothing left
