"""The embed task: a model's sentence embeddings, made the way its author's stack makes them.

A sentence-transformers folder says how in ``modules.json`` (`stack.py`): pooling, Dense layers,
Normalize, and the prompt put before each text. Reading all of it, rather than assuming mean
pooling, keeps embeddings equal to ``SentenceTransformer(folder).encode``. With
`[model].long_text = "chunk"`, a long text's windows are scored as units and meet again here:
their token-weighted mean, then the model's own normalization. `StackText` is the stack's text
side (tokenizer, prompt, windows) without its weights: embed's encoding and extractive
summarize's read texts through it, and `Embedder` puts the weights behind it.

What the job writes of a dense vector (`DenseVectors`): its first `[embed].truncate_dim`
dimensions, normalized after the cut where the model normalizes (sentence-transformers cuts its
normalized vector and stops there: the same direction, cosine 1), then `[embed].quantize`d
(`batchscore.models.quantize`). A SparseEncoder's stack writes term weights instead
(`batchscore.models.sparse`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from torch import nn

from batchscore.errors import JobError, ModelError
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, Task, fields, text_rows
from batchscore.models.encoder import SentenceEncoder, dense_weights
from batchscore.models.locate import check_model_files, load_pretrained
from batchscore.models.quantize import (
    CALIBRATED,
    Ranges,
    arrow_type,
    check_ranges,
    measure_ranges,
    quantize,
    quantized_to_arrow,
    unmeasurable,
)
from batchscore.models.sparse import SparseVectors
from batchscore.models.stack import Dense, Stack, read_stack
from batchscore.models.text import TextEncoder, Tokens
from batchscore.models.windows import mean_by_owner, overlap
from batchscore.runtime.bert import load_bert, read_shape
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded

# The float vectors, beside the quantized column, in what `finish` returns (no output column
# holds them): the quality gate judges the model by them, since quantizing is the same step at
# every precision, and a bit flipped by a value near zero is not the model moving.
UNQUANTIZED = "embedding, unquantized"


def check_encoder_files(path: Path, *, prompt_name: str | None, allow_pickle: bool) -> None:
    """What `validate` can check of an encoder without loading it: every module of its stack
    is one batchscore runs, its files are there, and the job's prompt is one of its own."""
    stack = read_stack(path)
    check_model_files(stack.encoder, allow_pickle)
    for step in stack.head:
        if isinstance(step, Dense):
            dense_weights(step, allow_pickle)
    stack.prompt(prompt_name)


def check_embed_options(stack: Stack, options: EmbedConfig) -> None:
    """The `[embed]` keys against the model (`validate`, and every load): a dense model's cut
    within its dimensions and ranges of its cut's length, sparse keys for a sparse model only;
    every problem at once, as a `JobError` (exit 2)."""
    where = stack.source or stack.encoder
    problems = [f"[embed].{p}" for p in options.problems()]
    if stack.sparse:
        problems += [
            f"[embed].{key}: {where} is a sparse encoder, whose vectors are weights of "
            "vocabulary words; keep fewer of them with [embed].top_k"
            for key in ("truncate_dim", "quantize")
            if getattr(options, key) is not None
        ]
    elif options.top_k is not None:
        problems.append(
            f"[embed].top_k: keeps a sparse encoder's largest weights, and {where} is a dense "
            "encoder; cut its vectors with [embed].truncate_dim"
        )
    width = stack.width()
    if width and options.truncate_dim and options.truncate_dim > width and not stack.sparse:
        problems.append(
            f"[embed].truncate_dim: {options.truncate_dim} is more than the {width} "
            f"dimensions of {where}'s embeddings"
        )
    if width and options.ranges is not None and not problems:
        try:
            check_ranges(options.ranges, dense_dim(width, stack, options), str(where))
        except JobError as exc:
            problems += exc.problems
    if problems:
        raise JobError(problems)


def dense_dim(width: int, stack: Stack, options: EmbedConfig) -> int:
    """A dense model's vectors' length as written: the job's cut, else the model's own (which
    sentence-transformers caps at the width), else all of it."""
    if options.truncate_dim is not None:
        return options.truncate_dim
    return min(stack.truncate_dim or width, width)


def check_stack_files(path: Path, options: object, *, allow_pickle: bool) -> None:
    """An encoder's whole stack when its model is a folder (`check_encoder_files`, with the
    job's prompt name), else its one file."""
    if path.is_dir():
        prompt = getattr(options, "prompt_name", None)
        check_encoder_files(path, prompt_name=prompt, allow_pickle=allow_pickle)
        stack = read_stack(path)
        if isinstance(options, EmbedConfig):
            check_embed_options(stack, options)
        elif stack.sparse:
            refuse_sparse(stack)
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
        input_ids, mask = self.text.encoder.collate(ids)
        tensor = self.executor.tensor
        vectors = self.model(tensor(input_ids), tensor(mask), self.text.skip)
        return vectors.cpu().numpy()  # the device-to-host copy: a sync point on CUDA

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


class DenseVectors:
    """A dense model's side of task embed: its `Embedder`'s vectors as the job writes them.

    int8 and uint8 need each dimension's range: the job's ``[embed].ranges``, else measured on
    the first rows this task finishes, which are the quality gate's sample (the job's first
    distinct rows; a dimension they leave with no width is refused, never written as one step):
    `batchscore.measure.settle` records them with the folder's decision, and every later
    load of the job (a resumed run, a Ray actor) is given them, so one output never mixes two.
    """

    def __init__(self, embedder: Embedder, options: EmbedConfig, where: Path) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.quantize = options.quantize
        self.ranges: Ranges | None = options.ranges
        if self.ranges is not None:
            check_ranges(self.ranges, self.dim, str(where))
        if self.quantize is None:
            self.type = pa.list_(pa.float32(), self.dim)
        else:
            self.type = arrow_type(self.quantize, self.dim)

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        return self.embedder.forward(ids)

    def columns(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        """The texts' vectors: float32, or quantized with the float ones beside them."""
        vectors = self.embedder.combine(results, encoded.owners, len(encoded.rows), encoded.lengths)
        floats = vectors_to_arrow(vectors, self.dim)
        if self.quantize is None:
            return {"embedding": floats}
        if self.quantize in CALIBRATED and self.ranges is None and len(vectors):
            self.ranges = measure_ranges(vectors)
        quantized = quantize(vectors, self.quantize, self.ranges)
        return {"embedding": quantized_to_arrow(quantized), UNQUANTIZED: floats}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        """By cosine, of the float vectors where the column is quantized."""
        column = UNQUANTIZED if UNQUANTIZED in reference and UNQUANTIZED in candidate else None
        return agreement.vectors(reference, candidate, column or "embedding", gate)


class EmbedTask(Adapter):
    """embed: one `embedding` per row: fixed_size_list<float32>[dim] (int8 or uint8 when
    quantized, [dim / 8] bytes of bits for binary), or a sparse encoder's struct of weights."""

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
        self.set_up(path, model=model, options=options, inp=inp)
        text = self.encoding.text
        check_embed_options(text.stack, options)
        self.vectors: DenseVectors | SparseVectors
        if text.stack.sparse:
            self.vectors = SparseVectors(
                text.encoder, text.stack, model=model, executor=executor, top_k=options.top_k
            )
        else:
            embedder = Embedder(
                text,
                model,
                executor,
                normalize=options.normalize,
                truncate_dim=options.truncate_dim or text.stack.truncate_dim,
            )
            self.vectors = DenseVectors(embedder, options, path)
        self.columns = fields(self.output_names(options), {"embedding": self.vectors.type})

    @property
    def ranges(self) -> Ranges | None:
        """The int8 / uint8 calibration ranges it quantizes with (None: none, or none yet)."""
        return self.vectors.ranges

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.vectors.forward([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return self.vectors.columns(encoded, results)

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return self.vectors.agreement(reference, candidate, gate)


def calibrates(options: object) -> bool:
    """Whether the job's vectors need int8 / uint8 ranges measured on its rows: settled once
    per output folder, from the quality gate's sample (`batchscore.measure.settle`)."""
    return (
        isinstance(options, EmbedConfig)
        and options.quantize in CALIBRATED
        and options.ranges is None
    )


def measured_ranges(task: Task | None) -> Ranges:
    """The ranges ``task`` measured on the sample it scored (see `calibrates`)."""
    ranges = task.ranges if isinstance(task, EmbedTask) else None
    if ranges is None:  # none of the sample's rows could be scored
        raise unmeasurable("none of them could be scored")
    return ranges


def vectors_to_arrow(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    """[rows, dim] float32 -> fixed_size_list<float32>[dim] without a Python loop (polars reads
    it as an Array, pyarrow and Lance as vectors). Built from the buffer: ``pa.array`` of a
    numpy array first asks whether it is a pandas object, which imports pandas (0.4 s)."""
    values = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1)
    flat = pa.Array.from_buffers(pa.float32(), len(values), [None, pa.py_buffer(values)])
    return pa.FixedSizeListArray.from_arrays(flat, dim)
