"""A BERT encoder in plain torch, its weights read straight from ``model.safetensors``.

Importing transformers' modeling code costs seconds of start-up on a small CPU, longer than the
first batch takes to score; a BERT encoder is a few matmuls and layer norms. This module runs the
folders it can prove it runs exactly as transformers' ``BertModel`` does (`read_shape`: absolute
positions, an encoder, an activation it knows, safetensors weights), and `load_bert` gives up
(returns None, so the caller loads through transformers) on any weight it cannot place or lacks,
rather than run with random ones. Layers are plain ``nn.Linear`` / ``nn.LayerNorm`` /
``nn.Embedding``, so precision's load-time transforms (casts, int8's Linear swap) see them.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

log = logging.getLogger("batchscore")
# config.json's hidden_act -> the torch module computing it (transformers' ACT2FN, same formulas)
ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact, with erf
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
    "silu": lambda: nn.SiLU(),
    "swish": lambda: nn.SiLU(),
}
WEIGHTS = "model.safetensors"
# Keys a checkpoint may hold that carry no weights of the encoder: buffers transformers rebuilds,
# and the pooler (sentence embeddings pool the hidden states themselves).
IGNORED = re.compile(r"embeddings\.(position_ids|token_type_ids)|pooler\.dense\.(weight|bias)")
# transformers' parameter names -> this module's, for the parts outside an encoder layer ...
OUTER = {
    "embeddings.word_embeddings.": "words.",
    "embeddings.position_embeddings.": "positions.",
    "embeddings.token_type_embeddings.": "types.",
    "embeddings.LayerNorm.": "embedding_norm.",
}
# ... and inside one (``encoder.layer.N.``, here ``layers.N.``)
INNER = {
    "attention.self.query.": "query.",
    "attention.self.key.": "key.",
    "attention.self.value.": "value.",
    "attention.output.dense.": "attention_out.",
    "attention.output.LayerNorm.": "attention_norm.",
    "intermediate.dense.": "intermediate.",
    "output.dense.": "output.",
    "output.LayerNorm.": "output_norm.",
}
LAYER = re.compile(r"encoder\.layer\.(\d+)\.(.+)")


@dataclass(frozen=True)
class BertShape:
    """The part of config.json the encoder is built from (``config`` to its callers, as
    transformers' models have: `SentenceEncoder` reads ``hidden_size``). A key the file leaves
    out takes transformers' ``BertConfig`` default, as it does there."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


def read_shape(folder: Path) -> BertShape | None:
    """The folder's shape when this module runs it as transformers would; None (saying why in
    the debug log) for anything else, which then loads through transformers."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    why = refusal(folder, config) if isinstance(config, dict) else "config.json is no object"
    if why:
        log.debug("%s: loading through transformers: %s", folder, why)
        return None
    return BertShape(**{k: v for k, v in config.items() if k in BertShape.__dataclass_fields__})


def refusal(folder: Path, config: dict) -> str | None:
    """Why the native encoder would not run this folder as transformers does; None if it would."""
    width, heads = config.get("hidden_size", 768), config.get("num_attention_heads", 12)
    checks = {
        "model_type is not bert": config.get("model_type") != "bert",
        "its code is the folder's own (auto_map)": "auto_map" in config,
        "positions are not absolute": config.get("position_embedding_type", "absolute")
        != "absolute",
        "a decoder": bool(config.get("is_decoder") or config.get("add_cross_attention")),
        f"hidden_act {config.get('hidden_act')!r} is not one of {', '.join(ACTIVATIONS)}": (
            config.get("hidden_act", "gelu") not in ACTIVATIONS
        ),
        "hidden_size is no multiple of num_attention_heads": not (
            isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads == 0
        ),
        f"no {WEIGHTS}": not (folder / WEIGHTS).is_file(),
    }
    return next((why for why, refused in checks.items() if refused), None)


class EncoderOutput(NamedTuple):
    """What `SentenceEncoder` reads of an encoder's output, named as transformers names it."""

    last_hidden_state: torch.Tensor


class Layer(nn.Module):
    """One encoder layer: self-attention, then the feed-forward block, each closed by a residual
    and a LayerNorm (post-norm, as BERT has it)."""

    def __init__(self, shape: BertShape, device: str | None = None) -> None:
        super().__init__()
        width, eps, at = shape.hidden_size, shape.layer_norm_eps, {"device": device}
        self.heads = shape.num_attention_heads
        self.query, self.key, self.value = (nn.Linear(width, width, **at) for _ in range(3))
        self.attention_out = nn.Linear(width, width, **at)
        self.attention_norm = nn.LayerNorm(width, eps=eps, **at)
        self.intermediate = nn.Linear(width, shape.intermediate_size, **at)
        self.activation = ACTIVATIONS[shape.hidden_act]()
        self.output = nn.Linear(shape.intermediate_size, width, **at)
        self.output_norm = nn.LayerNorm(width, eps=eps, **at)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [batch, heads, length, head width]
            return t.view(batch, length, self.heads, -1).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        attended = attended.transpose(1, 2).reshape(batch, length, width)
        x = self.attention_norm(self.attention_out(attended) + x)
        return self.output_norm(self.output(self.activation(self.intermediate(x))) + x)


def embedding(rows: int, width: int, device: str | None) -> nn.Embedding:
    """An embedding table; on the meta device, one drawn from no random values (torch draws
    meta normals through its compiler, whose import costs seconds)."""
    if device == "meta":
        return nn.Embedding(rows, width, _weight=torch.empty(rows, width, device="meta"))
    return nn.Embedding(rows, width, device=device)


class BertEncoder(nn.Module):
    """Token ids and their padding mask to the last hidden states, as ``BertModel`` computes
    them (without its pooler, which sentence embeddings do not use). ``device="meta"`` builds
    it without drawing random weights, for `load_bert` to replace."""

    def __init__(self, shape: BertShape, device: str | None = None) -> None:
        super().__init__()
        self.config = shape
        width, at = shape.hidden_size, {"device": device}
        self.words = embedding(shape.vocab_size, width, device)
        self.positions = embedding(shape.max_position_embeddings, width, device)
        self.types = embedding(shape.type_vocab_size, width, device)
        self.embedding_norm = nn.LayerNorm(width, eps=shape.layer_norm_eps, **at)
        self.layers = nn.ModuleList(Layer(shape, device) for _ in range(shape.num_hidden_layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> EncoderOutput:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Summed in transformers' order (words + types, then positions): floats round alike.
        x = self.words(input_ids) + self.types(token_type_ids) + self.positions(positions)
        x = self.embedding_norm(x)
        # [batch, 1, 1, length]: every query attends to its row's real tokens, never to padding
        keep = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return EncoderOutput(x)


def native_key(key: str) -> str | None:
    """This module's name for a transformers parameter name (no "bert." prefix); None if it
    names nothing here."""
    for theirs, ours in OUTER.items():
        if key.startswith(theirs):
            return ours + key[len(theirs) :]
    match = LAYER.fullmatch(key)
    if match:
        index, rest = match.groups()
        for theirs, ours in INNER.items():
            if rest.startswith(theirs):
                return f"layers.{index}.{ours}{rest[len(theirs) :]}"
    return None


def native_state(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The checkpoint's tensors under this module's names, and the keys that fit nowhere.

    A checkpoint saved from a task model (``BertForMaskedLM``, say) holds the encoder under
    "bert." beside its task head; the head is left out, as ``AutoModel`` leaves it out.
    """
    prefixed = any(key.startswith("bert.") for key in weights)
    state, unplaced = {}, []
    for key, tensor in weights.items():
        if prefixed and not key.startswith("bert."):
            continue  # another task's head
        base = key.removeprefix("bert.") if prefixed else key
        if IGNORED.fullmatch(base):
            continue
        name = native_key(base)
        if name is None:
            unplaced.append(key)
        else:
            state[name] = tensor
    return state, unplaced


def load_bert(folder: Path, shape: BertShape) -> BertEncoder | None:
    """The encoder with the folder's weights, each read once; None when the weights do not fit
    the shape (a key left over, one missing, a size that differs)."""
    state, unplaced = native_state(load_file(str(folder / WEIGHTS)))
    # No random weights drawn to be overwritten: `assign` takes the loaded tensors. (The meta
    # device as an argument: a `with torch.device` block imports torch's compiler, seconds.)
    encoder = BertEncoder(shape, device="meta")
    expected = set(encoder.state_dict())
    missing = sorted(expected - set(state))
    if unplaced or missing:
        why = f"weights it cannot place: {unplaced[:3]}" if unplaced else f"lacks {missing[:3]}"
        log.debug("%s: loading through transformers: %s", folder, why)
        return None
    try:
        encoder.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # a size mismatch: the config and the weights disagree
        log.debug("%s: loading through transformers: %s", folder, exc)
        return None
    return encoder
