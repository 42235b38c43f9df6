"""An encoder stack's weights behind its `StackText`: the Transformer loaded (the native BERT
encoder where it runs the folder exactly), the stack as one module (`encoder.py`), units in and
sentence embeddings out. embed's dense vectors and extractive summarize's sentences are made
here; what `validate` can check of a stack without loading it is checked here too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from batchscore.errors import ModelError
from batchscore.job.sections import ModelConfig
from batchscore.models.source.locate import check_model_files, load_pretrained
from batchscore.models.stack.encoder import SentenceEncoder, dense_weights
from batchscore.models.stack.stack import Dense, Stack, read_stack
from batchscore.models.stack.stack_text import StackText
from batchscore.models.text.windows import mean_by_owner
from batchscore.runtime.bert import load_bert, read_shape
from batchscore.runtime.executor import Executor
from batchscore.runtime.transfer import Pending


def check_encoder_files(path: Path, *, prompt_name: str | None, allow_pickle: bool) -> None:
    """What `validate` can check of an encoder without loading it: every module of its stack
    is one batchscore runs, its files are there, and the job's prompt is one of its own."""
    stack = read_stack(path)
    check_model_files(stack.encoder, allow_pickle)
    for step in stack.head:
        if isinstance(step, Dense):
            dense_weights(step, allow_pickle)
    stack.prompt(prompt_name)


def check_stack_files(path: Path, *, prompt_name: str | None, allow_pickle: bool) -> Stack | None:
    """An encoder's whole stack when its model is a folder (`check_encoder_files`, with the
    job's prompt name), read for the task's own checks; else its one file (None)."""
    if not path.is_dir():
        check_model_files(path, allow_pickle)
        return None
    check_encoder_files(path, prompt_name=prompt_name, allow_pickle=allow_pickle)
    return read_stack(path)


def load_transformer(path: Path, model: ModelConfig, executor: Executor) -> nn.Module:
    """The stack's Transformer: the native BERT encoder where it runs the folder exactly (no
    transformers import, seconds less start-up), else transformers' ``AutoModel``."""
    check_model_files(path, model.allow_pickle)
    shape = read_shape(path)
    encoder = load_bert(path, shape) if shape is not None else None
    if encoder is not None:
        return encoder
    from transformers import AutoModel

    return load_pretrained(AutoModel, path, model, executor)


def refuse_sparse(stack: Stack) -> None:
    """Sentences are ranked by a dense encoder's vectors; a sparse one's are not those."""
    raise ModelError(
        f"{stack.source}: a sparse encoder (SPLADE), whose term weights embed writes; "
        "extractive summarize ranks sentences with a dense encoder's vectors"
    )


class Embedder:
    """A dense encoder stack's weights behind its `StackText`: units in, sentence embeddings
    out, cut to their first ``truncate_dim`` dimensions when asked."""

    def __init__(
        self,
        text: StackText,
        model: ModelConfig,
        executor: Executor,
        *,
        normalize: bool,
        truncate_dim: int | None = None,
    ) -> None:
        if text.stack.sparse:
            refuse_sparse(text.stack)
        transformer = load_transformer(text.stack.encoder, model, executor)
        module = SentenceEncoder(transformer, text.stack, model.allow_pickle)
        self.model = executor.prepare(module)
        self.text = text
        self.executor = executor
        self.dim = min(truncate_dim or module.dim, module.dim)  # what is kept of the stack's
        self.normalize = normalize or text.stack.normalize

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        """One batch of units through the stack; float32 [units, dim] on the host, before the
        stack's final Normalize (see `combine`)."""
        return self.launch(ids).result()  # the device-to-host copy: a sync point on CUDA

    def launch(self, ids: list[np.ndarray]) -> Pending:
        """As `forward`, the vectors still on their way to the host: the batch loop launches
        the next batch before it waits for them (`batchscore.runtime.transfer`)."""
        input_ids, mask = self.text.encoder.collate(ids)
        tensor = self.executor.tensor
        return self.executor.host(self.model(tensor(input_ids), tensor(mask), self.text.skip))

    def combine(
        self, vectors: np.ndarray, owners: np.ndarray, count: int, lengths: np.ndarray
    ) -> np.ndarray:
        """Per text: the mean of its units' vectors weighted by their tokens, cut to `dim`, then
        normalized (the stack's Normalize, or `[embed].normalize`). A text of one unit is its
        vector."""
        if not count:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = mean_by_owner(vectors.reshape(len(owners), -1), owners, count, lengths)
        out = out[:, : self.dim]
        if self.normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32, copy=False)
