"""What every task adapter shares: the `Encoding` that makes an `Encoded` window (one of the
units of work every layer shares, `batchscore.work.units`) and the `Task` protocol the stages
call.

The pipeline knows nothing else of a model. A task reads its input columns from a window,
encodes the rows it can (naming the others in ``errors``), scores batches of units, turns the
results back into output columns, one value per encoded row, and says how to compare two
scorings of the same rows (the quality gate's measure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.source.locate import check_model_files
from batchscore.work.units import Encoded


class Encoding(Protocol):
    """How a task turns a window of rows into units, with no weights behind it.

    Built from the model folder's tokenizer, config and stack alone, so `batchscore plan` can
    count what a run will meet without loading the model; each adapter's `encode` is its
    encoding's, so the two cannot drift. ``inputs`` are the input columns it reads.
    """

    inputs: tuple[str, ...]
    bucketing: bool  # False: batches by max_rows only (inputs have no length to sort by)

    def encode(self, table: pa.Table) -> Encoded: ...


class Task(Encoding, Protocol):
    """A task adapter: its encoding, and the model that scores what it encodes. ``columns`` are
    its output fields."""

    columns: list[pa.Field]

    def forward(self, encoded: Encoded, batch: np.ndarray) -> Any: ...

    def finish(self, encoded: Encoded, results: Any) -> dict[str, pa.Array]:
        """The output columns, one value per encoded row; an ``error`` column among them (a
        string, null where the row scored) makes those rows row errors (`work/row_errors.py`)."""
        ...

    def usage(self, encoded: Encoded, results: Any) -> dict[str, pa.Array]:
        """The usage columns `count_usage` added, one value per encoded row ({} without)."""
        ...

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        """How far ``candidate`` outputs (another precision's) are from fp32's ``reference``."""
        ...


class Adapter:
    """An entry of the task table (`batchscore.models.tasks`): everything that sets a task
    apart, declared by its adapter class before any model is loaded. Each adapter declares its
    encoding (`encoding_type`, the weight-free part `batchscore plan` loads), the input columns
    it reads and their kinds, its output columns' names (once: its `columns` are built from
    them), how its model's files are checked, what of the model besides its files decides the
    output (the fingerprint's parts) and whether it generates text. The defaults here are a
    plain model folder's."""

    encoding_type: type
    encoding: Any  # an `encoding_type`, built by `set_up`
    columns: list[pa.Field]
    # the columns `[output].usage = true` adds to the task's own (`count_usage`)
    usage_names: tuple[str, ...] = ("prompt_tokens",)
    counting = False

    def set_up(self, path: Path, *, model: ModelConfig, options: Any, inp: InputConfig) -> Any:
        """Every adapter's first step: its encoding (`encoding_type`, the weight-free part
        `batchscore plan` builds alone), whose input columns, bucketing and `encode` become the
        adapter's own, so a plan and its run cannot drift. Returns the encoding."""
        self.encoding = self.encoding_type(path, model=model, options=options, inp=inp)
        self.inputs: tuple[str, ...] = self.encoding.inputs
        self.bucketing: bool = self.encoding.bucketing
        return self.encoding

    def encode(self, table: pa.Table) -> Encoded:
        """The rows' units, as the adapter's encoding makes them."""
        return self.encoding.encode(table)

    def count_usage(self) -> None:
        """Write the tokens the model read per row too (`[output].usage`): called once, when
        the adapter is built, so `columns` (the output schema) holds `usage_names`."""
        self.columns = [*self.columns, *fields(self.usage_names, USAGE)]
        self.counting = True

    def usage(self, encoded: Encoded, results: Any) -> dict[str, pa.Array]:
        """The tokens the model read for each encoded row: the token ids of its units, as they
        went in (truncated, special tokens and a prompt included, every window of a long text,
        repeats counted for each row that holds them); {} unless `count_usage` was called.
        A task whose units are not token ids counts what its model saw in their ``lengths``
        instead (an image: its patches, the image tokens), and this sums those the same way."""
        if not self.counting or "prompt_tokens" not in self.usage_names:
            return {}
        return {"prompt_tokens": tokens_per_row(encoded)}

    @staticmethod
    def input_kinds(inp: InputConfig, options: Any) -> dict[str, str]:
        """The input columns the task reads, each with its kind ("text" or "numeric")."""
        raise NotImplementedError

    @classmethod
    def output_names(cls, options: Any) -> tuple[str, ...]:
        """The task's output columns, in order, under these options."""
        raise NotImplementedError

    @classmethod
    def check_files(cls, path: Path, options: Any, *, allow_pickle: bool) -> None:
        """Check the model's files are there and loadable, without loading weights."""
        check_model_files(path, allow_pickle)

    @classmethod
    def fingerprint_parts(cls, model: ModelConfig, path: Path, options: Any) -> dict[str, Any]:
        """What decides the output besides the model's files and the job's keys; each part only
        when it is there, so outputs made before batchscore read it still resume."""
        return {}

    @classmethod
    def generates(cls, model: ModelConfig, path: Path) -> bool:
        """Whether its outputs are generated text (tokens, not numbers to compare)."""
        return False

    @classmethod
    def footer_metadata(cls, path: Path, options: Any) -> dict[str, str]:
        """What every data file's footer says of the task's output, beside the job's facts
        (`batchscore.output.contents.file_metadata`): the names of a vector's positions where
        the model names them, so the output reads without the model. From the model's files,
        no weights loaded; {} for a task whose positions have no names."""
        return {}


# the usage columns' types: what the model read per row, and what a generative one wrote
USAGE = {"prompt_tokens": pa.int32(), "generated_tokens": pa.int32()}


def tokens_per_row(encoded: Encoded) -> pa.Array:
    """Each encoded row's units' tokens summed, in ``rows`` order (int32)."""
    counts = np.bincount(encoded.owners, weights=encoded.lengths, minlength=len(encoded.rows))
    return pa.array(counts.astype(np.int32), type=pa.int32())


def fields(names: tuple[str, ...], types: dict[str, pa.DataType]) -> list[pa.Field]:
    """Output columns of these ``names`` (an adapter's `output_names`), typed by ``types``."""
    return [pa.field(name, types[name]) for name in names]


def vectors_to_arrow(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    """[rows, dim] float32 -> fixed_size_list<float32>[dim] without a Python loop (polars reads
    it as an Array, pyarrow and Lance as vectors). Built from the buffer: ``pa.array`` of a
    numpy array first asks whether it is a pandas object, which imports pandas (0.4 s)."""
    values = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1)
    flat = pa.Array.from_buffers(pa.float32(), len(values), [None, pa.py_buffer(values)])
    return pa.FixedSizeListArray.from_arrays(flat, dim)
