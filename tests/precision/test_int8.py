"""int8 as a load-time transform: quality against fp32 on real rows, sensitive layers kept in float,
deterministic, and generic (a tiny random BERT works as well as MiniLM)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from batchscore.models.stack.pooling import pool
from batchscore.models.text.text import TextEncoder
from batchscore.pipeline.sampler import form_batches
from batchscore.precision.int8 import fewest_to_keep, max_passes, quantize_int8, search_passes
from batchscore.precision.int8_linear import CHUNK_ROWS, Int8Linear, int8_available, weight_levels

pytestmark = pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")

Batch = tuple[torch.Tensor, torch.Tensor]


def embed(module: nn.Module, batch: Batch) -> torch.Tensor:
    input_ids, mask = batch
    hidden = module(input_ids=input_ids, attention_mask=mask).last_hidden_state
    return F.normalize(pool(hidden.float(), mask, "mean"), dim=-1)


def batches(encoder: TextEncoder, texts: list[str]) -> list[Batch]:
    ids, _ = encoder.encode(texts)
    plan = form_batches(np.array([len(i) for i in ids]), 8192, 512)
    collated = [encoder.collate([ids[i] for i in rows]) for rows in plan]
    return [(torch.from_numpy(a), torch.from_numpy(m)) for a, m in collated]


def embed_all(module: nn.Module, data: list[Batch]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([embed(module, b) for b in data])


@pytest.fixture(scope="module")
def minilm(minilm_path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(minilm_path).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def rows(minilm_path, small_corpus) -> tuple[list[Batch], list[Batch]]:
    """100 calibration rows and 100 other rows to judge on, both spread over the corpus."""
    texts = small_corpus.column("text").to_pylist()
    encoder = TextEncoder(minilm_path, 256, False)
    return batches(encoder, texts[0:200:2]), batches(encoder, texts[1:200:2])


@pytest.fixture(scope="module")
def quantized(minilm, rows):
    module, report = quantize_int8(copy.deepcopy(minilm), rows[0], embed, min_cosine=0.99)
    return module, report


def test_int8_minilm_keeps_quality_on_rows_it_did_not_calibrate_on(minilm, rows, quantized):
    module, report = quantized
    held_out = rows[1]
    cosine = (embed_all(module, held_out) * embed_all(minilm, held_out)).sum(dim=1)
    assert cosine.min() >= 0.99
    assert report.min_cosine >= report.target == pytest.approx(0.995)
    assert report.rows == 100 and report.int8_share > 0.9
    swapped = [m for m in module.modules() if isinstance(m, Int8Linear)]
    assert len(swapped) == len(report.quantized) > 0


def test_a_stricter_target_keeps_the_most_sensitive_layers_in_float(minilm, rows):
    short = rows[0][:2]  # the shortest rows (batches come length-sorted): cheap, and int8's worst
    module, report = quantize_int8(copy.deepcopy(minilm), short, embed, min_cosine=0.999)
    assert report.kept, "0.9995 on every row is beyond all-int8 MiniLM: some layers must stay"
    assert report.min_cosine >= report.target
    ranked = list(report.sensitivity)
    assert list(report.kept) == ranked[: len(report.kept)]  # kept most-sensitive first
    layers = dict(module.named_modules())
    assert all(type(layers[path]) is nn.Linear for path in report.kept)
    assert all(isinstance(layers[path], Int8Linear) for path in report.quantized)


def test_quantization_is_deterministic(minilm, rows, quantized):
    first, report = quantized
    again, report2 = quantize_int8(copy.deepcopy(minilm), rows[0], embed, min_cosine=0.99)
    assert report2.quantized == report.quantized and report2.kept == report.kept
    assert report2.min_cosine == report.min_cosine
    assert torch.equal(embed_all(first, rows[1]), embed_all(again, rows[1]))


def test_a_tiny_random_bert_quantizes_and_unreached_layers_stay_float():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    module = BertModel(config).eval().requires_grad_(False)
    module.unused = nn.Linear(32, 32)  # a head the forward never calls
    generator = torch.Generator().manual_seed(1)
    data = [
        (torch.randint(1, 100, (8, n), generator=generator), torch.ones(8, n, dtype=torch.long))
        for n in (5, 17, 40)
    ]
    reference = embed_all(module, data)
    module, report = quantize_int8(module, data, embed, min_cosine=0.99)
    assert report.kept["unused"] == "not reached by the calibration rows"
    assert report.min_cosine >= report.target
    cosine = (embed_all(module, data) * reference).sum(dim=1)
    assert cosine.min() == pytest.approx(report.min_cosine, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_matches_linear_across_chunks(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(2, CHUNK_ROWS, 48)  # 2 chunks of rows: chunk seams must not show
    with torch.inference_mode():
        expected = linear(x)
        smooth = torch.rand(48) + 0.5
        for layer in (Int8Linear(linear), Int8Linear(linear, smooth)):
            got = layer(x.to(dtype))
            assert got.dtype == dtype and got.shape == expected.shape
            error = (got.float() - expected).norm(dim=-1) / expected.norm(dim=-1)
            assert error.max() < 0.03


def test_weights_keep_to_7_bits_on_cpus_without_vnni(monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    weight_levels.cache_clear()
    try:
        linear = nn.Linear(16, 8)
        layer = Int8Linear(linear)
        assert weight_levels() == 63
        assert torch.allclose(layer.w_scale, linear.weight.abs().amax(dim=1) / 63)
    finally:
        weight_levels.cache_clear()


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 300), data=st.data())
def test_the_search_finds_the_shortest_passing_prefix_of_any_number_of_layers(layers, data):
    """However many Linear layers rank (BERT-base has 72, BERT-large 144), the search settles on
    the shortest prefix that meets the target within `search_passes` passes, plus one where only
    every layer in float does; a cap below ceil(log2) used to stop short and keep them all."""
    needed = data.draw(st.integers(1, layers), label="shortest passing prefix")
    ranked = [f"layer{i}" for i in range(layers)]
    runs = []

    def score(keep: set[str]) -> torch.Tensor:
        runs.append(len(keep))
        return torch.tensor([1.0 if len(keep) >= needed else 0.5])

    keep, cosines = fewest_to_keep(ranked, score, target=0.9)
    assert keep == ranked[:needed] and float(cosines.min()) == 1.0
    assert len(runs) <= search_passes(layers) + 1 and search_passes(layers) <= 9


def test_a_bert_with_more_than_64_linear_layers_keeps_some_in_int8_within_the_bound():
    """A 12-layer BERT (73 Linear layers with the pooler) whose all-int8 pass misses the target:
    the search finds a prefix to keep in float and quantizes the rest, within `max_passes`."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=12, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model = BertModel(config).eval().requires_grad_(False)
    layers = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert layers == 73
    generator = torch.Generator().manual_seed(1)
    data = [
        (torch.randint(1, 100, (8, n), generator=generator), torch.ones(8, n, dtype=torch.long))
        for n in (5, 17, 40)
    ]
    _, loose = quantize_int8(copy.deepcopy(model), data, embed, min_cosine=None)
    # a target halfway between all-int8's worst row and 1: all-int8 misses it
    _, report = quantize_int8(model, data, embed, min_cosine=loose.min_cosine)
    assert report.kept and report.quantized, report.summary()
    assert report.min_cosine >= report.target > loose.min_cosine
    assert report.passes <= max_passes(layers) == 10
