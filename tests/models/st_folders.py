"""sentence-transformers folders saved by sentence-transformers itself, and the hub's older layout.

`save_st` has the installed sentence-transformers build and save a stack, so the folder is exactly
what users' tools write today; `to_hub_layout` rewrites one the way models on the hub were saved
by sentence-transformers 2.x (old class paths, `pooling_mode_*_tokens` flags, the Transformer in
`0_Transformer/`, Dense weights as `pytorch_model.bin`), which sentence-transformers still loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig
from batchscore.models.embed import EmbedTask
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.runtime.executor import Executor
from tests.models import tiny

LEGACY = "sentence_transformers.models."
POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def tiny_bert(folder: Path, tokenizer_from: Path | None, texts: list[str] = ()) -> Path:
    """A 2-layer BERT encoder with random weights: MiniLM's WordPiece tokenizer, or (without
    ``tokenizer_from``) a cased byte-level BPE trained on ``texts``."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    if tokenizer_from is not None:
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
        vocab = 30522
    else:
        tok = tiny.bpe(list(texts), ["<s>", "<pad>", "</s>", "<unk>"], "<s> $A </s>")
        tiny.save_tokenizer(tok, folder, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>")  # fmt: skip
        vocab = tok.get_vocab_size()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, initializer_range=0.3,
                        pad_token_id=1 if tokenizer_from is None else 0)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    return folder


def save_st(
    folder: Path,
    encoder: Path,
    *,
    modes: str | tuple[str, ...] = "mean",
    dense: list[tuple[int, str, bool]] = (),
    normalize: bool = False,
    include_prompt: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
    max_seq_length: int | None = None,
    truncate_dim: int | None = None,
) -> Path:
    """Build a SentenceTransformer from modules and ``save()`` it; ``dense`` lists (outputs,
    activation class name, residual) per Dense layer; ``truncate_dim`` is saved in its config,
    which ``encode`` then applies by default."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    transformer = Transformer(str(encoder), max_seq_length=max_seq_length)
    width = transformer.get_embedding_dimension()
    modules: list[Any] = [transformer, Pooling(width, pooling_mode=modes,
                                               include_prompt=include_prompt)]  # fmt: skip
    width *= 1 if isinstance(modes, str) else len(modes)
    torch.manual_seed(1)
    for out, activation, residual in dense:
        modules.append(Dense(width, out, activation_function=getattr(torch.nn, activation)(),
                             use_residual=residual))  # fmt: skip
        width = out
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, prompts=prompts,
                                default_prompt_name=default_prompt, device="cpu")  # fmt: skip
    model.truncate_dim = truncate_dim
    model.save(str(folder))
    return folder


def st_encode(folder: Path, texts: list[str], **options: Any) -> np.ndarray:
    """The reference: sentence-transformers' own ``encode`` of the folder (fp32, CPU)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=16, convert_to_numpy=True, **options)


def to_hub_layout(source: Path, folder: Path, *, lowercase: bool = False) -> Path:
    """A copy of an ST 6 folder laid out as sentence-transformers 2.x saved hub models."""
    shutil.copytree(source, folder)
    modules = json.loads((folder / "modules.json").read_text())
    inner = folder / "0_Transformer"
    inner.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).rename(inner / name)
    max_length = json.loads((inner / "tokenizer_config.json").read_text())["model_max_length"]
    (folder / "sentence_bert_config.json").unlink()
    (inner / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_length, "do_lower_case": lowercase})
    )
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        module["type"] = LEGACY + kind
        config_file = folder / module["path"] / "config.json"
        if kind == "Transformer":
            module["path"] = "0_Transformer"
        elif kind == "Pooling":
            config = json.loads(config_file.read_text())
            modes = config.pop("pooling_mode")
            modes = [modes] if isinstance(modes, str) else modes
            legacy = {"word_embedding_dimension": config.pop("embedding_dimension")}
            legacy |= {flag: mode in modes for mode, flag in POOLING_FLAGS.items()}
            config_file.write_text(json.dumps({**legacy, **config}))
        elif kind == "Dense":
            from safetensors.torch import load_file

            weights = folder / module["path"] / "model.safetensors"
            torch.save(load_file(str(weights)), weights.with_name("pytorch_model.bin"))
            weights.unlink()
            config = json.loads(config_file.read_text())
            config.pop("module_input_name"), config.pop("module_output_name")
            config_file.write_text(json.dumps(config))
        elif kind == "Normalize":
            shutil.rmtree(folder / module["path"], ignore_errors=True)  # the hub's have none
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    return folder


def tiny_mlm(folder: Path, texts: list[str], *, bias: float = -4.0) -> Path:
    """A 2-layer BERT masked-language model with random weights and a BPE tokenizer trained on
    ``texts``; its output bias pushes most logits below zero, so SPLADE weights come out sparse
    (a few dozen of the 400 words per text), as a trained SPLADE model's do."""
    from transformers import BertConfig, BertForMaskedLM

    tok = tiny.bpe(list(texts), ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s> $A </s>")
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    tiny.save_tokenizer(tok, folder, **specials, unk_token="<unk>", mask_token="<mask>")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        initializer_range=0.3,
        pad_token_id=1,
    )
    model = BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.fill_(bias)
    model.save_pretrained(folder)
    return folder


def save_sparse(
    folder: Path,
    mlm: Path,
    *,
    strategy: str = "max",
    activation: str = "relu",
    prompts: dict[str, str] | None = None,
    default_prompt: str | None = None,
    max_active_dims: int | None = None,
    max_seq_length: int | None = None,
) -> Path:
    """Build a SparseEncoder (a fill-mask Transformer, then SpladePooling) and ``save()`` it."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer

    transformer = Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=max_seq_length)
    pooling = SpladePooling(pooling_strategy=strategy, activation_function=activation)
    model = SparseEncoder(
        modules=[transformer, pooling],
        prompts=prompts,
        default_prompt_name=default_prompt,
        max_active_dims=max_active_dims,
        device="cpu",
    )
    model.save(str(folder))
    return folder


def sparse_encode(folder: Path, texts: list[str], **options: Any) -> np.ndarray:
    """The reference: sentence-transformers' own ``SparseEncoder.encode`` (fp32, CPU), dense."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    out = model.encode(texts, batch_size=16, convert_to_sparse_tensor=False, **options)
    return out.cpu().numpy()


def to_sparse_v5_layout(source: Path, folder: Path) -> Path:
    """A copy of an ST 6 sparse folder as sentence-transformers 5.0 saved them: the
    ``sparse_encoder.models`` class paths, an ``MLMTransformer`` whose config says nothing of a
    task, and SpladePooling's ``word_embedding_dimension``."""
    shutil.copytree(source, folder)
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        module["type"] = "sentence_transformers.sparse_encoder.models." + (
            "MLMTransformer" if kind == "Transformer" else kind
        )
        if kind == "SpladePooling":
            config_file = folder / module["path"] / "config.json"
            config = json.loads(config_file.read_text())
            config["word_embedding_dimension"] = config.pop("embedding_dimension", None)
            config_file.write_text(json.dumps(config))
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    st_config = folder / "sentence_bert_config.json"
    old = json.loads(st_config.read_text())
    kept = {"max_seq_length": old.get("max_seq_length"), "do_lower_case": False}
    st_config.write_text(json.dumps(kept))
    return folder


def embed_column(
    path: Path, texts: list[str], options: EmbedConfig | None = None, **model: Any
) -> pa.Array:
    """batchscore's `embedding` column for ``texts`` (fp32, one thread), in length-bucketed,
    padded batches as a run forms them, typed as the task declares it."""
    config = ModelConfig(task="embed", precision="fp32", threads=1, **model)
    task = EmbedTask(
        path,
        model=config,
        options=options or EmbedConfig(),
        inp=InputConfig(path=()),
        executor=Executor(config),
    )
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, 1024, 16)
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    column = task.finish(encoded, results)["embedding"]
    assert column.type == task.columns[0].type
    return column


def floats(column: pa.Array) -> np.ndarray:
    """A fixed-size vector column as a float32 matrix."""
    return np.array(column.to_pylist(), dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row cosine of two matrices."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
