"""The embed task: a Hugging Face encoder, the pooling its folder prescribes, L2-normalised.

sentence-transformers folders say how to pool in ``modules.json`` / ``1_Pooling/config.json``;
reading that (rather than assuming mean pooling) keeps embeddings equal to the model's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from batchscore.errors import ModelError
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Encoded, text_rows
from batchscore.models.locate import load_pretrained
from batchscore.models.text import TextEncoder
from batchscore.pipeline.executor import Executor

POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "last",
}


def pooling_mode(path: Path) -> str:
    """The pooling a sentence-transformers folder prescribes; mean when it prescribes none."""
    modules = path / "modules.json"
    if not modules.is_file():
        return "mean"
    for module in json.loads(modules.read_text()):
        if module.get("type", "").endswith("Pooling"):
            config = json.loads((path / module["path"] / "config.json").read_text())
            modes = [mode for key, mode in POOLING_KEYS.items() if config.get(key)]
            if len(modes) != 1:
                raise ModelError(f"{path}: unsupported pooling combination {modes or 'none'}")
            return modes[0]
    return "mean"


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce token states [batch, tokens, dim] to one vector per row, ignoring padding."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    if mode == "last":
        last = mask.sum(dim=1) - 1  # right padding: the last real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    total, count = (hidden * weights).sum(dim=1), weights.sum(dim=1).clamp(min=1)
    return total / (count.sqrt() if mode == "mean_sqrt_len" else count)


class Embedder:
    """A loaded encoder model that turns token id batches into pooled vectors."""

    def __init__(self, path: Path, model: ModelConfig, executor: Executor, normalize: bool) -> None:
        from transformers import AutoModel

        module = load_pretrained(AutoModel, path, model, executor)
        self.encoder = TextEncoder(path, model.max_length, model.trust_remote_code)
        self.model = executor.prepare(module)
        self.executor = executor
        self.mode = pooling_mode(path)
        self.normalize = normalize
        self.dim = int(module.config.hidden_size)

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        """Embed one batch; returns float32 [rows, dim] on the host."""
        input_ids, mask = self.encoder.collate(ids)
        mask_t = self.executor.tensor(mask)
        hidden = self.model(input_ids=self.executor.tensor(input_ids), attention_mask=mask_t)
        vectors = pool(hidden.last_hidden_state.float(), mask_t, self.mode)
        if self.normalize:
            vectors = F.normalize(vectors, dim=-1)
        return vectors.cpu().numpy()  # the device-to-host copy: a sync point on CUDA


class EmbedTask:
    """embed: one `embedding` (fixed_size_list<float32>[dim]) per row."""

    bucketing = True

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.text: "text"}

    @staticmethod
    def output_names(options: object) -> tuple[str, ...]:
        return ("embedding",)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: EmbedConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.embedder = Embedder(path, model, executor, options.normalize)
        self.inputs = (inp.text,)
        self.columns = [pa.field("embedding", pa.list_(pa.float32(), self.embedder.dim))]

    def encode(self, table: pa.Table) -> Encoded:
        return self.embedder.encoder.encode_rows(*text_rows(table, self.inputs[0]))

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.embedder.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return {"embedding": vectors_to_arrow(results, self.embedder.dim)}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.vectors(reference, candidate, "embedding", gate)


def vectors_to_arrow(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    """[rows, dim] float32 -> fixed_size_list<float32>[dim] without a Python loop (polars reads
    it as an Array, pyarrow and Lance as vectors)."""
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, dim)
