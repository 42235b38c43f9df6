"""The embed task: a model's sentence embeddings, made the way its author's stack makes them.

A sentence-transformers folder says how in ``modules.json`` (`stack/stack.py`): pooling, Dense
layers, Normalize, and the prompt put before each text. Reading all of it, rather than assuming
mean pooling, keeps embeddings equal to ``SentenceTransformer(folder).encode``. With
`[model].long_text = "chunk"`, a long text's windows are scored as units and meet again here:
their token-weighted mean, then the model's own normalization (`batchscore.models.stack`:
`StackText` reads the texts, `Embedder` puts the weights behind it).

What the job writes of a dense vector (`DenseVectors`): its first `[embed].truncate_dim`
dimensions, normalized after the cut where the model normalizes (sentence-transformers cuts its
normalized vector and stops there: the same direction, cosine 1), then `[embed].quantize`d
(`batchscore.models.vector_codes`). A SparseEncoder's stack writes term weights instead
(`batchscore.models.sparse`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.errors import JobError
from batchscore.job.ranges import Ranges
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, Task, fields, vectors_to_arrow
from batchscore.models.images import TowersTask, towers_of
from batchscore.models.sparse import SparseVectors
from batchscore.models.stack.embedder import Embedder, check_stack_files
from batchscore.models.stack.stack import Stack, stack_parts
from batchscore.models.stack.stack_text import StackText
from batchscore.models.text.inputs import text_rows
from batchscore.models.vector_codes import (
    CALIBRATED,
    arrow_type,
    check_ranges,
    codes_to_arrow,
    measure_ranges,
    to_codes,
    unmeasurable,
)
from batchscore.models.vision.family import find_towers
from batchscore.runtime.executor import Executor
from batchscore.runtime.transfer import Pending
from batchscore.work.units import Encoded

# The float vectors, beside the column of codes, in what `finish` returns (no output column
# holds them): the quality gate judges the model by them, since coding is the same step at
# every precision, and a bit flipped by a value near zero is not the model moving.
FLOATS = "embedding, floats"


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


class EmbedEncoding:
    """embed's encoding: one unit per text (or a long text's windows), as its stack reads it."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: EmbedConfig, inp: InputConfig
    ) -> None:
        if inp.image is not None:
            towers_of(path)  # a CLIP or SigLIP model reads images (`models.tasks.adapter`)
        self.text = StackText(path, model, prompt_name=options.prompt_name)
        self.inputs = (inp.text,)

    def encode(self, table: pa.Table) -> Encoded:
        texts, rows, errors = text_rows(table, self.inputs[0])
        return self.text.tokens(texts).encoded(rows, errors)


class DenseVectors:
    """A dense model's side of task embed: its `Embedder`'s vectors as the job writes them.

    int8 and uint8 need each dimension's range: the job's ``[embed].ranges``, else measured on
    the first rows this task finishes, which are the quality gate's sample (the job's first
    distinct rows; a dimension they leave with no width is refused, never written as one step):
    `batchscore.measure.decide` records them with the folder's decision, and every later
    load of the job (a resumed run, a Ray actor) is given them, so one output never mixes two.
    """

    def __init__(self, embedder: Embedder, options: EmbedConfig, where: Path) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.codes = options.quantize  # the kind of code written, or None: floats
        self.ranges: Ranges | None = options.ranges
        if self.ranges is not None:
            check_ranges(self.ranges, self.dim, str(where))
        if self.codes is None:
            self.type = pa.list_(pa.float32(), self.dim)
        else:
            self.type = arrow_type(self.codes, self.dim)

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        return self.embedder.forward(ids)

    def launch(self, ids: list[np.ndarray]) -> Pending:
        return self.embedder.launch(ids)

    def columns(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        """The texts' vectors: float32, or their codes with the float ones beside them."""
        vectors = self.embedder.combine(results, encoded.owners, len(encoded.rows), encoded.lengths)
        floats = vectors_to_arrow(vectors, self.dim)
        if self.codes is None:
            return {"embedding": floats}
        if self.codes in CALIBRATED and self.ranges is None and len(vectors):
            self.ranges = measure_ranges(vectors)
        codes = to_codes(vectors, self.codes, self.ranges)
        return {"embedding": codes_to_arrow(codes), FLOATS: floats}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        """By cosine, of the float vectors where the column holds their codes."""
        column = FLOATS if FLOATS in reference and FLOATS in candidate else None
        return agreement.vectors(reference, candidate, column or "embedding", gate)


class EmbedTask(Adapter):
    """embed: one `embedding` per row: fixed_size_list<float32>[dim] (int8 or uint8 when
    quantized, [dim / 8] bytes of bits for binary), or a sparse encoder's struct of weights."""

    encoding_type = EmbedEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return TowersTask.input_kinds(inp, options)  # images only with [input].image

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("embedding",)

    @classmethod
    def check_files(cls, path: Path, options: EmbedConfig, *, allow_pickle: bool) -> None:
        """The stack's files, and the `[embed]` keys against the model (a CLIP or SigLIP
        model's, `TowersTask`'s)."""
        if find_towers(path) is not None:
            TowersTask.check_files(path, options, allow_pickle=allow_pickle)
            return
        stack = check_stack_files(path, prompt_name=options.prompt_name, allow_pickle=allow_pickle)
        if stack is not None:
            check_embed_options(stack, options)

    @classmethod
    def fingerprint_parts(
        cls, model: ModelConfig, path: Path, options: EmbedConfig
    ) -> dict[str, str]:
        if find_towers(path) is not None:
            return TowersTask.fingerprint_parts(model, path, options)
        return stack_parts(path, prompt_name=options.prompt_name, normalize=options.normalize)

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

    def launch(self, encoded: Encoded, batch: np.ndarray) -> Pending:
        """As `forward`, the results still on their way to the host (`pipeline.static`)."""
        return self.vectors.launch([encoded.ids[i] for i in batch])

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return self.vectors.columns(encoded, results)

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return self.vectors.agreement(reference, candidate, gate)


def calibrates(options: object) -> bool:
    """Whether the job's vectors need int8 / uint8 ranges measured on its rows: settled once
    per output folder, from the quality gate's sample (`batchscore.measure.decide`)."""
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
