"""The native BERT encoder on OpenVINO computes what it computes on torch, or is refused; an
int8-calibrated one keeps its int8 layers in int8 and fp32's embeddings.

Against the real all-MiniLM-L6-v2 on corpus texts, and tiny random BERTs that vary what the graph
must honour (the activation, token types, padding, a row of one token). A graph that disagrees
with torch, or ids torch would refuse, must never turn into numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import ModelError
from batchscore.job.runtimes import openvino_missing
from batchscore.models.stack.pooling import pool
from batchscore.models.text.text import TextEncoder
from batchscore.precision.int8 import quantize_int8
from batchscore.precision.int8_linear import Int8Linear, int8_available, weight_levels
from batchscore.precision.table import bf16_native
from batchscore.runtime import bert_openvino
from batchscore.runtime.bert import BertEncoder, load_bert, read_shape
from batchscore.runtime.bert_openvino import OpenVinoBert, openvino_bert
from tests.runtime.test_bert import embeddings, min_cosine, padded_batch, tiny_bert

pytestmark = pytest.mark.skipif(openvino_missing() is not None, reason=str(openvino_missing()))
openvino = pytest.importorskip("openvino")  # where it is missing, so is the runtime
needs_vnni = pytest.mark.skipif(
    not int8_available() or weight_levels() < 127, reason="no int8 VNNI (or AMX) units here"
)


def test_minilm_on_openvino_matches_torch(minilm_path: Path, corpus):
    texts = corpus.column("text").to_pylist()[:: corpus.num_rows // 300][:300]
    encoder = TextEncoder(minilm_path, 256, False)
    ids, truncated = encoder.encode(texts)
    assert truncated > 0  # rows of the full window are in the sample, beside short ones
    native = load_bert(minilm_path, read_shape(minilm_path)).eval()
    compiled = openvino_bert(native, threads=2)
    ours, theirs = embeddings(compiled, encoder, ids), embeddings(native, encoder, ids)
    worst, gap = min_cosine(ours, theirs), (ours - theirs).abs().max().item()
    print(f"MiniLM on OpenVINO vs torch, fp32: min cosine {worst:.8f}, max gap {gap:.2g}")
    assert worst >= 0.99999 and gap < 1e-4


@pytest.mark.skipif(not bf16_native(torch.device("cpu")), reason="this CPU has no bf16 units")
def test_minilm_in_bf16_on_openvino_keeps_the_fp32_embeddings(minilm_path: Path, corpus):
    """A bfloat16 encoder runs OpenVINO's bf16 kernels: as close to fp32 as torch's bf16, and
    its hidden states come back in bfloat16 for the layers after it."""
    texts = corpus.column("text").to_pylist()[:: corpus.num_rows // 300][:300]
    encoder = TextEncoder(minilm_path, 256, False)
    ids, _ = encoder.encode(texts)
    native = load_bert(minilm_path, read_shape(minilm_path)).eval()
    fp32 = embeddings(native, encoder, ids)
    native = native.to(torch.bfloat16)
    compiled = openvino_bert(native, threads=2)
    ours, theirs = embeddings(compiled, encoder, ids), embeddings(native, encoder, ids)
    print(f"MiniLM in bf16 vs fp32: min cosine {min_cosine(ours, fp32):.6f} on OpenVINO, "
          f"{min_cosine(theirs, fp32):.6f} on torch")  # fmt: skip
    assert min_cosine(ours, fp32) >= 0.999 and min_cosine(ours, theirs) >= 0.999
    ids, mask, _ = padded_batch(native.config.vocab_size)
    assert compiled(ids, mask).last_hidden_state.dtype == torch.bfloat16


def test_bf16_without_bf16_units_is_refused(minilm_path, monkeypatch):
    """A CPU without bf16 units cannot be had in a test run: OpenVINO's report of its units is
    replaced by one without BF16. OpenVINO would run bf16 emulated (slow) or quietly in f32."""

    class NoBf16(openvino.Core):
        def get_property(self, device: str, name: str) -> object:
            found = super().get_property(device, name)
            units = name == "OPTIMIZATION_CAPABILITIES"
            return [unit for unit in found if unit != "BF16"] if units else found

    monkeypatch.setattr(openvino, "Core", NoBf16)
    native = load_bert(minilm_path, read_shape(minilm_path)).eval()
    with pytest.raises(ModelError, match="no bf16 units"):
        openvino_bert(native.to(torch.bfloat16), threads=1)
    with pytest.raises(ModelError, match=r"float32 and bfloat16 encoders here, not torch\.float16"):
        openvino_bert(native.to(torch.float16), threads=1)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu", "silu"])
def test_tiny_bert_on_openvino_matches_torch(tmp_path, minilm_path, hidden_act):
    folder = tiny_bert(tmp_path, minilm_path, hidden_act=hidden_act)
    native = load_bert(folder, read_shape(folder)).eval()
    compiled = openvino_bert(native, threads=1)
    ids, mask, types = padded_batch(native.config.vocab_size)
    with torch.inference_mode():
        for args in ((ids, mask, types), (ids, mask), (ids[3:, :1], mask[3:, :1])):
            want, got = native(*args).last_hidden_state, compiled(*args).last_hidden_state
            real = args[1].bool()
            assert got.shape == want.shape and got.dtype == torch.float32
            torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, minilm_path):
    """A tiny random BERT (both token types, GELU) and its OpenVINO build."""
    folder = tiny_bert(tmp_path_factory.mktemp("tiny"), minilm_path, type_vocab_size=2)
    native = load_bert(folder, read_shape(folder)).eval()
    return native, openvino_bert(native, threads=1)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_batch_shape_and_padding_gives_torchs_numbers(tiny_pair, data):
    """Property: for any rows x length, any right padding and any token types, every real
    token's hidden state equals torch's, and no row's numbers depend on its neighbours."""
    native, compiled = tiny_pair
    rows = data.draw(st.integers(1, 6), label="rows")
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=rows, max_size=rows), label="lengths")
    width = max(lengths)
    seed = data.draw(st.integers(0, 2**16), label="seed")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, native.config.vocab_size, (rows, width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = torch.randint(0, 2, (rows, width), generator=generator) * mask
    with torch.inference_mode():
        want = native(ids * mask, mask, types).last_hidden_state
        got = compiled(ids * mask, mask, types).last_hidden_state
        first = compiled(ids[:1, : lengths[0]], mask[:1, : lengths[0]], types[:1, : lengths[0]])
    real = mask.bool()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(
        first.last_hidden_state[0], got[0, : lengths[0]], atol=2e-5, rtol=1e-5
    )


def test_ids_torch_refuses_are_refused(tmp_path, minilm_path):
    """OpenVINO's Gather reads an index past its table as zeros; the encoder must not."""
    folder = tiny_bert(tmp_path, minilm_path)
    native = load_bert(folder, read_shape(folder)).eval()
    compiled = openvino_bert(native, threads=1)
    ids, mask, types = padded_batch(native.config.vocab_size)
    for bad in (ids.clone().fill_(native.config.vocab_size), ids.clone().fill_(-1)):
        with pytest.raises(IndexError):
            native(bad, mask)
        with pytest.raises(IndexError, match="token id"):
            compiled(bad, mask)
    with pytest.raises(IndexError, match="token type 2"):
        compiled(ids, mask, types * 2)


def test_a_graph_that_disagrees_with_torch_is_refused(tmp_path, minilm_path, monkeypatch):
    """A real OpenVINO graph built from other weights stands in for a converter bug."""
    folder = tiny_bert(tmp_path, minilm_path)
    native = load_bert(folder, read_shape(folder)).eval()
    other = load_bert(folder, read_shape(folder)).eval()
    with torch.no_grad():
        other.layers[1].output_norm.bias.add_(0.5)  # the last layer's output, moved
    build = bert_openvino.build_graph
    monkeypatch.setattr(bert_openvino, "build_graph", lambda encoder: build(other))
    with pytest.raises(ModelError, match="disagrees with torch's"):
        openvino_bert(native, threads=1)


def test_a_compiled_encoder_has_no_parameters_to_transform(minilm_path):
    """Nothing of the torch encoder is left for a cast or int8's swap to reach unseen."""
    native = load_bert(minilm_path, read_shape(minilm_path)).eval()
    compiled = openvino_bert(native, threads=1)
    assert isinstance(compiled, OpenVinoBert) and not list(compiled.parameters())
    assert compiled.config.hidden_size == 384


def int8_minilm(minilm_path: Path, corpus) -> tuple[BertEncoder, torch.Tensor, list, TextEncoder]:
    """MiniLM calibrated to int8 on half of 300 corpus texts (every Linear it may), the fp32
    embeddings of all 300, their token ids and the tokenizer."""
    texts = corpus.column("text").to_pylist()[:: corpus.num_rows // 300][:300]
    encoder = TextEncoder(minilm_path, 256, False)
    ids, _ = encoder.encode(texts)
    native = load_bert(minilm_path, read_shape(minilm_path)).eval().requires_grad_(False)
    fp32 = embeddings(native, encoder, ids)
    calibration = [tuple(map(torch.from_numpy, encoder.collate(ids[i : i + 16])))
                   for i in range(0, len(ids), 32)]  # fmt: skip

    def forward(module: torch.nn.Module, batch: tuple) -> torch.Tensor:
        return pool(module(*batch).last_hidden_state.float(), batch[1], ("mean",), 0)

    with torch.inference_mode():
        quantize_int8(native, calibration, forward, min_cosine=0.99)
    return native, fp32, ids, encoder


@needs_vnni
def test_int8_minilm_on_openvino_multiplies_in_int8_at_fp32s_embeddings(minilm_path, corpus):
    """The layers int8 calibration chose run as OpenVINO int8 matmuls (its runtime graph says
    so, layer by layer), their inputs quantized per group of channels at run time: as close to
    fp32 as torch's int8 or closer, on rows the calibration never saw."""
    native, fp32, ids, encoder = int8_minilm(minilm_path, corpus)
    layers = sum(isinstance(m, Int8Linear) for m in native.modules())
    assert bert_openvino.int8_group(native) == 128  # MiniLM's 384 and 1536 inputs
    compiled = openvino_bert(native, threads=2)
    ours, theirs = embeddings(compiled, encoder, ids), embeddings(native, encoder, ids)
    print(f"MiniLM in int8 vs fp32: min cosine {min_cosine(ours, fp32):.5f} on OpenVINO, "
          f"{min_cosine(theirs, fp32):.5f} on torch; {layers} int8 layers")  # fmt: skip
    assert min_cosine(ours, fp32) >= 0.99 and min_cosine(ours, fp32) >= min_cosine(theirs, fp32)
    runtime = compiled.compiled.get_runtime_model().get_ordered_ops()
    kinds = [(op.get_rt_info()["layerType"].astype(str),
              op.get_rt_info()["runtimePrecision"].astype(str)) for op in runtime]  # fmt: skip
    assert kinds.count(("FullyConnected", "i8")) == layers > 0
    ids, mask, types = padded_batch(native.config.vocab_size)
    assert compiled(ids, mask, types).last_hidden_state.dtype == torch.float32


@pytest.mark.skipif(not int8_available(), reason="this torch build has no int8 CPU kernels")
def test_int8_on_openvino_needs_vnni_and_a_group_that_fits(tmp_path, minilm_path, monkeypatch):
    """Without VNNI (or AMX) OpenVINO's int8 would not pay, and a layer whose inputs no group
    divides would run decompressed: both are refused (the runtime "auto" keeps torch's int8)."""
    folder = tiny_bert(tmp_path, minilm_path, hidden_size=48, intermediate_size=80)
    native = load_bert(folder, read_shape(folder)).eval().requires_grad_(False)
    assert bert_openvino.int8_group(native) is None  # no int8 layer: nothing to group
    ids, mask, _ = padded_batch(native.config.vocab_size)
    with torch.inference_mode():
        quantize_int8(native, [(ids, mask)], lambda m, b: m(*b).last_hidden_state[:, 0],
                      min_cosine=None)  # fmt: skip
    monkeypatch.setattr(bert_openvino, "weight_levels", lambda: 127)  # as with VNNI, any CPU
    with pytest.raises(ModelError, match=r"no int8 group of \(128, 64, 32\) divides .*\[48, 80\]"):
        openvino_bert(native, threads=1)
    monkeypatch.setattr(bert_openvino, "weight_levels", lambda: 63)  # as on a CPU without VNNI
    with pytest.raises(ModelError, match="needs VNNI or AMX int8 units"):
        openvino_bert(native, threads=1)
