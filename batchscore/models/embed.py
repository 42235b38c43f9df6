"""The embed task: a model's sentence embeddings, made the way its author's stack makes them.

A sentence-transformers folder says how in ``modules.json`` (`stack.py`): pooling, Dense layers,
Normalize, and the prompt put before each text. Reading all of it, rather than assuming mean
pooling, keeps embeddings equal to ``SentenceTransformer(folder).encode``. With
`[model].long_text = "chunk"`, a long text's windows are scored as units and meet again here:
their token-weighted mean, then the model's own normalization. `StackText` is the stack's text
side (tokenizer, prompt, windows) without its weights: embed's encoding and extractive
summarize's read texts through it, and `Embedder` puts the weights behind it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from torch import nn

from batchscore.errors import ModelError
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields, text_rows
from batchscore.models.encoder import SentenceEncoder, dense_weights
from batchscore.models.locate import check_model_files, load_pretrained
from batchscore.models.stack import Dense, read_stack
from batchscore.models.text import TextEncoder, Tokens
from batchscore.models.windows import mean_by_owner, overlap
from batchscore.runtime.bert import load_bert, read_shape
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded


def check_encoder_files(path: Path, *, prompt_name: str | None, allow_pickle: bool) -> None:
    """What `validate` can check of an encoder without loading it: every module of its stack
    is one batchscore runs, its files are there, and the job's prompt is one of its own."""
    stack = read_stack(path)
    check_model_files(stack.encoder, allow_pickle)
    for step in stack.head:
        if isinstance(step, Dense):
            dense_weights(step, allow_pickle)
    stack.prompt(prompt_name)


def check_stack_files(path: Path, options: object, *, allow_pickle: bool) -> None:
    """An encoder's whole stack when its model is a folder (`check_encoder_files`, with the
    job's prompt name), else its one file."""
    if path.is_dir():
        prompt = getattr(options, "prompt_name", None)
        check_encoder_files(path, prompt_name=prompt, allow_pickle=allow_pickle)
    else:
        check_model_files(path, allow_pickle)


def stack_parts(path: Path, options: object) -> dict[str, str]:
    """An encoder stack's parts of the fingerprint: the stack, when it is more than one pooling
    and a Normalize (or the job turns its Normalize off), and the prompt it is given."""
    if not path.is_dir():
        return {}
    parts = {}
    stack = read_stack(path)
    if not stack.plain or (stack.normalize and not getattr(options, "normalize", True)):
        parts["stack"] = stack.describe()
    if prompt := stack.prompt(getattr(options, "prompt_name", None)):
        parts["prompt"] = prompt
    return parts


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


class StackText:
    """How an encoder stack reads texts, without its weights: the Transformer's tokenizer
    (lowercasing first when the stack says so), the prompt put before every text, and with
    `[model].long_text = "chunk"` a long text's windows, each led by the prompt."""

    def __init__(self, path: Path, model: ModelConfig, *, prompt_name: str | None = None) -> None:
        self.stack = read_stack(path)
        self.prompt = self.stack.prompt(prompt_name)
        self.encoder = TextEncoder(
            self.stack.encoder,
            model.max_length,
            model.trust_remote_code,
            lowercase=self.stack.lowercase,
        )
        self.chunk = model.long_text == "chunk"
        self.head, counted = self.encoder.prompt_tokens(self.prompt) if self.prompt else (0, 0)
        self.skip = 0 if self.stack.include_prompt else counted  # prompt tokens left out of pooling
        window = self.encoder.max_length - self.encoder.single.specials if self.chunk else 0
        if self.chunk and self.head >= window - overlap(self.encoder.max_length):
            raise ModelError(
                f'{path}: its prompt "{self.prompt}" leaves no room in a window of '
                f"{self.encoder.max_length} tokens; raise [model].max_length"
            )

    def tokens(self, texts: list[str]) -> Tokens:
        """The texts' units, the prompt put before each: one per text, or a long text's windows."""
        if self.prompt:
            texts = [self.prompt + text for text in texts]
        return self.encoder.tokens(texts, chunk=self.chunk, head=self.head)


class EmbedEncoding:
    """embed's encoding: one unit per text (or a long text's windows), as its stack reads it."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: EmbedConfig, inp: InputConfig
    ) -> None:
        self.text = StackText(path, model, prompt_name=options.prompt_name)
        self.inputs = (inp.text,)

    def encode(self, table: pa.Table) -> Encoded:
        texts, rows, errors = text_rows(table, self.inputs[0])
        return self.text.tokens(texts).encoded(rows, errors)


class Embedder:
    """An encoder stack's weights behind its `StackText`: units in, sentence embeddings out."""

    def __init__(
        self, text: StackText, model: ModelConfig, executor: Executor, *, normalize: bool
    ) -> None:
        transformer = load_transformer(text.stack.encoder, model, executor)
        module = SentenceEncoder(transformer, text.stack, model.allow_pickle)
        self.model = executor.prepare(module)
        self.text = text
        self.executor = executor
        self.dim = module.dim
        self.normalize = normalize or text.stack.normalize

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        """One batch of units through the stack; float32 [units, dim] on the host, before the
        stack's final Normalize (see `combine`)."""
        input_ids, mask = self.text.encoder.collate(ids)
        tensor = self.executor.tensor
        vectors = self.model(tensor(input_ids), tensor(mask), self.text.skip)
        return vectors.cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def combine(
        self, vectors: np.ndarray, owners: np.ndarray, count: int, lengths: np.ndarray
    ) -> np.ndarray:
        """Per text: the mean of its units' vectors weighted by their tokens, then normalized
        (the stack's Normalize, or `[embed].normalize`). A text of one unit is its vector."""
        if not count:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = mean_by_owner(vectors.reshape(len(owners), -1), owners, count, lengths)
        if self.normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32, copy=False)


class EmbedTask(Adapter):
    """embed: one `embedding` (fixed_size_list<float32>[dim]) per row."""

    encoding_type = EmbedEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.text: "text"}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("embedding",)

    @classmethod
    def check_files(cls, path: Path, options: object, *, allow_pickle: bool) -> None:
        check_stack_files(path, options, allow_pickle=allow_pickle)

    @classmethod
    def fingerprint_parts(cls, model: ModelConfig, path: Path, options: object) -> dict[str, str]:
        return stack_parts(path, options)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: EmbedConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.encoding = self.encoding_type(path, model=model, options=options, inp=inp)
        self.inputs, self.bucketing = self.encoding.inputs, self.encoding.bucketing
        self.embedder = Embedder(self.encoding.text, model, executor, normalize=options.normalize)
        vector = pa.list_(pa.float32(), self.embedder.dim)
        self.columns = fields(self.output_names(options), {"embedding": vector})

    def encode(self, table: pa.Table) -> Encoded:
        return self.encoding.encode(table)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.embedder.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        vectors = self.embedder.combine(results, encoded.owners, len(encoded.rows), encoded.lengths)
        return {"embedding": vectors_to_arrow(vectors, self.embedder.dim)}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.vectors(reference, candidate, "embedding", gate)


def vectors_to_arrow(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    """[rows, dim] float32 -> fixed_size_list<float32>[dim] without a Python loop (polars reads
    it as an Array, pyarrow and Lance as vectors). Built from the buffer: ``pa.array`` of a
    numpy array first asks whether it is a pandas object, which imports pandas (0.4 s)."""
    values = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1)
    flat = pa.Array.from_buffers(pa.float32(), len(values), [None, pa.py_buffer(values)])
    return pa.FixedSizeListArray.from_arrays(flat, dim)
