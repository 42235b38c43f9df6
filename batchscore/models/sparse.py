"""Sparse encoders: sentence-transformers' ``SparseEncoder`` with SPLADE pooling, run as task
embed. A masked-language model scores every word of its vocabulary at every token; SPLADE keeps
``log(1 + relu(score))`` and takes the largest (or the sum) over the text's tokens, so a text
becomes a weight per vocabulary word, nearly all zero. The output column holds the non-zero ones:
``struct<indices: list<int32>, values: list<float32>>``, indices ascending, as vector stores
take sparse vectors (and as ``SparseEncoder.encode`` would give them, checked to 1e-3).

A long text read in windows (`[model].long_text = "chunk"`) is pooled across its windows the
way SPLADE pools across tokens: the largest weight of each word over every window (the sum, for
a model that sums), which is SPLADE's own max over the text's tokens, each token read in its
window's context. `[embed].top_k` (default: the model's ``max_active_dims``) then keeps the k
largest weights of each text, as ``encode(max_active_dims=k)`` does.

The vocabulary-wide logits are the memory to watch (30,522 floats per token for BERT's
vocabulary): the batch runs through the model `LOGIT_BYTES` of them at a time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from batchscore.job.sections import ModelConfig, QualityConfig
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.source.locate import load_pretrained
from batchscore.models.stack.stack import Stack
from batchscore.models.stack.stack_modules import Splade
from batchscore.models.text.text import TextEncoder
from batchscore.models.text.windows import reduce_by_owner
from batchscore.runtime.executor import Executor
from batchscore.runtime.transfer import Pending
from batchscore.work.units import Encoded

LOGIT_BYTES = 256 * 2**20  # float32 logits pooled at once: rows of a batch run in slices under it
SPARSE = pa.struct([("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float32()))])


def splade_pool(logits: torch.Tensor, mask: torch.Tensor, splade: Splade) -> torch.Tensor:
    """[rows, tokens, vocabulary] logits -> [rows, vocabulary] weights, padding left out, in
    float32; in place, since the logits are the largest tensor of the pass."""
    x = logits.float().mul_(mask.unsqueeze(-1).to(torch.float32)).relu_().log1p_()
    if splade.activation == "log1p_relu":
        x = x.log1p_()
    return x.amax(dim=1) if splade.strategy == "max" else x.sum(dim=1)


class SpladeEncoder(nn.Module):
    """Token ids -> SPLADE weights over the vocabulary [rows, vocabulary] (float32)."""

    def __init__(self, mlm: nn.Module, splade: Splade) -> None:
        super().__init__()
        self.mlm = mlm
        self.splade = splade
        self.dim = int(mlm.config.vocab_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = max(int(input_ids.shape[1]), 1)
        rows = max(1, LOGIT_BYTES // (tokens * self.dim * 4))
        pooled = [
            splade_pool(self.mlm(input_ids=ids, attention_mask=mask).logits, mask, self.splade)
            for ids, mask in zip(input_ids.split(rows), attention_mask.split(rows), strict=True)
        ]
        return torch.cat(pooled)


class SparseVectors:
    """A SparseEncoder's side of task embed: units in, one sparse vector per text out."""

    type = SPARSE
    ranges = None  # nothing to calibrate: weights are written as they are

    def __init__(
        self,
        encoder: TextEncoder,
        stack: Stack,
        *,
        model: ModelConfig,
        executor: Executor,
        top_k: int | None,
    ) -> None:
        from transformers import AutoModelForMaskedLM

        splade = stack.splade or Splade()  # a sparse stack always has one (`read_sparse`)
        mlm = load_pretrained(AutoModelForMaskedLM, stack.encoder, model, executor, complete=True)
        module = SpladeEncoder(mlm, splade)
        self.model = executor.prepare(module)
        self.encoder, self.executor = encoder, executor
        self.dim = module.dim
        self.strategy = splade.strategy
        self.top_k = top_k or stack.max_active_dims

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        """One batch of units: float32 [units, vocabulary] on the host."""
        return self.launch(ids).result()  # a sync point on CUDA

    def launch(self, ids: list[np.ndarray]) -> Pending:
        """As `forward`, the weights still on their way to the host (`pipeline.static`)."""
        input_ids, mask = self.encoder.collate(ids)
        tensor = self.executor.tensor
        return self.executor.host(self.model(tensor(input_ids), tensor(mask)))

    def columns(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        """Per text: its windows pooled as SPLADE pools tokens, its `top_k` largest weights."""
        count = len(encoded.rows)
        ufunc = np.maximum if self.strategy == "max" else np.add
        vectors = reduce_by_owner(results.reshape(-1, self.dim), encoded.owners, count, ufunc)
        return {"embedding": sparse_to_arrow(keep_largest(vectors, self.top_k))}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        """By cosine, as dense vectors are (`[quality].min_cosine` for the worst row)."""
        a, b = densify(reference["embedding"], self.dim), densify(candidate["embedding"], self.dim)
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        both_empty = (np.abs(a).sum(1) == 0) & (np.abs(b).sum(1) == 0)
        cos = np.where(both_empty, 1.0, (a * b).sum(1) / np.maximum(norms, 1e-12))
        result = Agreement()
        result.check("cosine_min", float(cos.min()) if len(cos) else 1.0, gate.min_cosine)
        result.metrics["cosine_mean"] = float(cos.mean()) if len(cos) else 1.0
        result.judge_rows(1.0 - cos, 1.0 - gate.min_cosine)
        return result


def keep_largest(vectors: np.ndarray, k: int | None) -> np.ndarray:
    """Each row's ``k`` largest weights (by magnitude), the rest zero: sentence-transformers'
    ``select_max_active_dims``, through the same ``torch.topk``, so ties fall alike."""
    if k is None or k >= vectors.shape[1] or not len(vectors):
        return vectors
    weights = torch.from_numpy(np.ascontiguousarray(vectors))
    _, top = torch.topk(weights.abs(), k, dim=-1)
    kept = torch.zeros_like(weights)
    kept.scatter_(-1, top, weights.gather(-1, top))
    return kept.numpy()


def sparse_to_arrow(vectors: np.ndarray) -> pa.StructArray:
    """[rows, vocabulary] -> struct<indices: list<int32>, values: list<float32>>: each row's
    non-zero weights, indices ascending (``nonzero`` walks a row left to right)."""
    rows, cols = np.nonzero(vectors)
    values = np.ascontiguousarray(vectors[rows, cols], dtype=np.float32)
    offsets = np.zeros(len(vectors) + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=len(vectors)), out=offsets[1:])
    cols = cols.astype(np.int32)
    offsets_array = pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)])

    def lists(kind: pa.DataType, flat: np.ndarray) -> pa.ListArray:
        inner = pa.Array.from_buffers(kind, len(flat), [None, pa.py_buffer(flat)])
        return pa.ListArray.from_arrays(offsets_array, inner)

    return pa.StructArray.from_arrays(
        [lists(pa.int32(), cols), lists(pa.float32(), values)], fields=list(SPARSE)
    )


def densify(column: pa.Array | pa.ChunkedArray, dim: int) -> np.ndarray:
    """A sparse column back to [rows, dim] float64 (a null row: zeros), to compare two."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    indices, values = column.flatten()  # the children as the (sliced) struct holds them
    lengths = pc.fill_null(pc.list_value_length(indices), 0).to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(len(column)), lengths)
    dense = np.zeros((len(column), dim))
    flat_indices = pc.list_flatten(indices).to_numpy(zero_copy_only=False)
    dense[rows, flat_indices] = pc.list_flatten(values).to_numpy(zero_copy_only=False)
    return dense
