"""The native BERT encoder computes what transformers' BertModel computes, or stands aside.

Against the real all-MiniLM-L6-v2 on corpus texts, and tiny random BERTs that vary what the
native module must honour: the activation, token types, padding, a task model's "bert." prefix.
Folders it does not understand (or whose weights do not fit) must load through transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from batchscore.job.sections import ModelConfig
from batchscore.models.stack.embedder import load_transformer
from batchscore.models.stack.pooling import pool
from batchscore.models.text.text import TextEncoder
from batchscore.precision.int8_linear import Int8Linear, int8_available
from batchscore.runtime.bert import BertEncoder, load_bert, read_shape
from batchscore.runtime.executor import Executor

FP32 = ModelConfig(task="embed", precision="fp32", max_length=256)


def reference(path: Path) -> torch.nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(path).eval()


def embeddings(
    module: torch.nn.Module, encoder: TextEncoder, ids: list[np.ndarray]
) -> torch.Tensor:
    """Mean-pooled last hidden states in length order, batches of 32 padded to their longest."""
    ids, out = sorted(ids, key=len), []
    with torch.inference_mode():
        for start in range(0, len(ids), 32):
            input_ids, mask = map(torch.from_numpy, encoder.collate(ids[start : start + 32]))
            hidden = module(input_ids=input_ids, attention_mask=mask).last_hidden_state
            out.append(pool(hidden.float(), mask, ("mean",), 0))
    return torch.cat(out)


def min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()


@pytest.fixture(scope="module")
def minilm(minilm_path: Path, corpus) -> tuple[TextEncoder, list[np.ndarray]]:
    """300 corpus texts spread over the corpus (some longer than 256 tokens), as token ids."""
    texts = corpus.column("text").to_pylist()[:: corpus.num_rows // 300][:300]
    encoder = TextEncoder(minilm_path, 256, False)
    ids, truncated = encoder.encode(texts)
    assert truncated > 0  # the long tail is in the sample
    return encoder, ids


def test_minilm_native_matches_transformers_fp32(minilm_path, minilm):
    native = load_bert(minilm_path, read_shape(minilm_path)).eval()
    worst = min_cosine(embeddings(native, *minilm), embeddings(reference(minilm_path), *minilm))
    print(f"MiniLM native vs transformers, fp32: min cosine {worst:.7f}")
    assert worst >= 0.9999


def int8_swapped(module: torch.nn.Module) -> torch.nn.Module:
    """Every Linear replaced by its int8 twin, as int8's load-time transform swaps them."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))
    return module


@pytest.mark.skipif(not int8_available(), reason="no int8 matmul on this CPU")
def test_minilm_native_matches_transformers_int8(minilm_path, minilm):
    native = int8_swapped(load_bert(minilm_path, read_shape(minilm_path)).eval())
    assert sum(isinstance(m, Int8Linear) for m in native.modules()) == 6 * 6
    hf = int8_swapped(reference(minilm_path))
    encoder, ids = minilm
    ids = ids[::3]  # a third of them: int8's kernels are slower to run in a test
    worst = min_cosine(embeddings(native, encoder, ids), embeddings(hf, encoder, ids))
    print(f"MiniLM native vs transformers, both int8: min cosine {worst:.7f}")
    assert worst >= 0.9999


def test_embed_loads_minilm_natively(minilm_path):
    module = load_transformer(minilm_path, FP32, Executor(FP32))
    assert isinstance(module, BertEncoder) and module.config.hidden_size == 384


def tiny_bert(folder: Path, minilm_path: Path, *, head: bool = False, **config: object) -> Path:
    """A 2-layer BERT with random weights and MiniLM's tokenizer files; ``head`` saves it as a
    masked-LM model, so its encoder's keys carry the "bert." prefix."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_path / name, folder / name)
    torch.manual_seed(0)
    settings = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, initializer_range=0.3, type_vocab_size=2)  # fmt: skip
    model = (BertForMaskedLM if head else BertModel)(BertConfig(**{**settings, **config}))
    model.save_pretrained(folder)
    return folder


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four rows of different lengths, right-padded, with both token types in use."""
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 3, 7, 1]
    ids = torch.randint(1000, vocab, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(max(lengths))[None, :] >= 2).long() * mask
    return ids * mask, mask, types


@pytest.mark.parametrize(
    ("head", "hidden_act"),
    [(False, "gelu"), (True, "gelu"), (False, "gelu_new"), (False, "relu"), (True, "silu")],
)
def test_tiny_bert_matches_transformers(tmp_path, minilm_path, head, hidden_act):
    folder = tiny_bert(tmp_path, minilm_path, head=head, hidden_act=hidden_act)
    if head:
        assert any(k.startswith("bert.") for k in load_file(str(folder / "model.safetensors")))
    native = load_bert(folder, read_shape(folder))
    assert native is not None
    ids, mask, types = padded_batch(native.config.vocab_size)
    hf = reference(folder)
    with torch.inference_mode():
        ours = native(ids, mask, types).last_hidden_state
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        alone = [native(ids[i : i + 1, :n], mask[i : i + 1, :n], types[i : i + 1, :n])
                 for i, n in enumerate(mask.sum(1).tolist())]  # fmt: skip
    real = mask.bool()
    assert torch.allclose(ours[real], theirs[real], atol=1e-5)
    for row, out in enumerate(alone):  # padding changes nothing of a row's own tokens
        assert torch.allclose(ours[row, : out.last_hidden_state.shape[1]], out[0][0], atol=1e-5)


def test_token_types_reach_the_embeddings(tmp_path, minilm_path):
    native = load_bert(tiny_bert(tmp_path, minilm_path), read_shape(tmp_path))
    ids, mask, types = padded_batch(native.config.vocab_size)
    with torch.inference_mode():
        assert not torch.allclose(native(ids, mask, types)[0], native(ids, mask)[0])


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    "changes",
    [{"position_embedding_type": "relative_key"}, {"is_decoder": True},
     {"hidden_act": "gelu_fast"}, {"model_type": "roberta"}, {"auto_map": {"AutoModel": "x.Y"}}],
)  # fmt: skip
def test_configs_it_does_not_understand_are_refused(tmp_path, minilm_path, changes):
    folder = tiny_bert(tmp_path, minilm_path)
    edit_config(folder, **changes)
    assert read_shape(folder) is None


@pytest.mark.parametrize("change", ["missing", "unexpected", "resized"])
def test_weights_that_do_not_fit_are_refused(tmp_path, minilm_path, change):
    folder = tiny_bert(tmp_path, minilm_path)
    weights = load_file(str(folder / "model.safetensors"))
    if change == "missing":
        del weights["encoder.layer.1.output.dense.bias"]
    elif change == "unexpected":
        weights["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(2)
    else:
        edit_config(folder, intermediate_size=48)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert load_bert(folder, read_shape(folder)) is None


def test_a_folder_it_refuses_loads_through_transformers(tmp_path, minilm_path):
    folder = tiny_bert(tmp_path, minilm_path, hidden_act="gelu_fast")
    module = load_transformer(folder, FP32, Executor(FP32))
    assert not isinstance(module, BertEncoder)
    assert type(module).__module__.startswith("transformers.")
    ids, mask, _ = padded_batch(module.config.vocab_size)
    with torch.inference_mode():
        assert torch.isfinite(module(input_ids=ids, attention_mask=mask).last_hidden_state).all()
