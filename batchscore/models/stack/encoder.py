"""The sentence-transformers stack as one torch module: Transformer, Pooling, then the head.

One module, so that what precision does at load (a cast, int8's Linear swap) reaches the Dense
layers too. It stops before the stack's final Normalize: a long text's windows are averaged
first, and normalized after (`Embedder.combine`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from batchscore.errors import ModelError
from batchscore.models.stack.pooling import pool
from batchscore.models.stack.stack import Dense, Stack


class DenseLayer(nn.Module):
    """sentence-transformers' Dense: ``activation(linear(x))``, plus the input with residual."""

    def __init__(self, spec: Dense) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = getattr(nn, spec.activation)()  # named in stack.ACTIVATIONS only
        self.residual_mode = spec.residual
        if spec.residual and spec.in_features != spec.out_features:
            self.residual = nn.Linear(spec.in_features, spec.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.residual_mode:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def dense_weights(spec: Dense, allow_pickle: bool) -> Path:
    """A Dense module's weights file: safetensors, or a pickle only when the job allows it."""
    safe, pickle = spec.folder / "model.safetensors", spec.folder / "pytorch_model.bin"
    if safe.is_file():
        return safe
    if pickle.is_file() and allow_pickle:
        return pickle
    if pickle.is_file():
        raise ModelError(
            f"{pickle}: Dense weights in a pickle file, which can run code when loaded; convert "
            "them to safetensors, or set [model].allow_pickle = true if you trust their source"
        )
    raise ModelError(f"{spec.folder}: no Dense weights (model.safetensors)")


def load_dense(spec: Dense, allow_pickle: bool) -> DenseLayer:
    """A Dense module with its weights; a pickle is read with ``weights_only``, which builds
    tensors and nothing else."""
    from safetensors.torch import load_file

    layer = DenseLayer(spec)
    file = dense_weights(spec, allow_pickle)
    if file.suffix == ".safetensors":
        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    missing, unexpected = layer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(
            f"{spec.folder}: the weights do not fit its config (missing: "
            f"{', '.join(missing) or 'none'}; unexpected: {', '.join(unexpected) or 'none'})"
        )
    return layer


class SentenceEncoder(nn.Module):
    """Token ids to the stack's vectors before its final Normalize (float32 on return)."""

    def __init__(self, transformer: nn.Module, stack: Stack, allow_pickle: bool) -> None:
        super().__init__()
        self.transformer = transformer
        self.modes = stack.modes
        self.steps = nn.ModuleList(
            load_dense(step, allow_pickle) if isinstance(step, Dense) else nn.Identity()
            for step in stack.body
        )
        self.normalizes = [not isinstance(step, Dense) for step in stack.body]
        width = int(transformer.config.hidden_size) * len(stack.modes)
        denses = [step for step in stack.body if isinstance(step, Dense)]
        if denses and denses[0].in_features != width:
            raise ModelError(
                f"{denses[0].folder}: a Dense of {denses[0].in_features} inputs after a "
                f"pooling of {width} values"
            )
        self.dim = denses[-1].out_features if denses else width

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, skip: int = 0
    ) -> torch.Tensor:
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask)
        states = hidden.last_hidden_state
        # Pooling sums over tokens in float32; the head runs in the model's own dtype.
        x = pool(states.float(), attention_mask, self.modes, skip).to(states.dtype)
        for step, normalizes in zip(self.steps, self.normalizes, strict=True):
            x = F.normalize(x, dim=-1) if normalizes else step(x)
        return x.float()
