"""The tensor task: numeric feature columns -> a float tensor -> any PyTorch model.

Rows have no length, so there is nothing to bucket: batches are cut by `[batching].max_rows`.
`[tensor].output` says how to read a model's output row: "class" (the argmax, an int64) or
"value" (a regressor's single number); `scores` always carries the raw output row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import BatchscoreError, ModelError
from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig, TensorConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields, vectors_to_arrow
from batchscore.models.numeric.factories import BUILTIN, find_factory, registered
from batchscore.models.numeric.features import feature_matrix, is_list
from batchscore.models.numeric.formats import check_export_archive, load_model, model_format
from batchscore.runtime.executor import Executor
from batchscore.work.shards import find_shards, open_shard
from batchscore.work.units import Encoded


def check_tensor_model(path: Path, options: TensorConfig) -> None:
    """Check the model file's format (and factory name) without loading any weights."""
    if not path.exists():
        raise ModelError(f"[model].path: {path}: no such file")
    fmt = model_format(path, options)
    if fmt == "export":
        check_export_archive(path)
    known = options.factory in BUILTIN or options.factory in registered()
    if fmt == "safetensors" and not known:
        find_factory(options.factory)  # raises, listing the known factories


def input_width(inp: InputConfig, options: TensorConfig) -> int | None:
    """How many features a row has: the job says, or its columns do (several number columns,
    or one fixed-size list column, whose size the first shard's schema tells)."""
    if options.num_features or len(inp.features) > 1:
        return options.num_features or len(inp.features)
    for shard in find_shards(inp) if inp.path else []:
        try:
            schema = open_shard(shard).schema_arrow
        except BatchscoreError:
            continue  # that shard fails alone when its turn comes
        if inp.features[0] in schema.names:
            kind = schema.field(inp.features[0]).type
            if pa.types.is_fixed_size_list(kind):
                return kind.list_size
            return None if is_list(kind) else 1
    return None


def output_rows(out: object, value: bool) -> torch.Tensor:
    """The model's output as [rows, k]: the first tensor of a tuple, a 1-D output as one column."""
    if isinstance(out, tuple | list):
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.ndim not in (1, 2):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"the model returned {shape}; the tensor task needs [rows] or [rows, k]")
    out = out.unsqueeze(1) if out.ndim == 1 else out
    if value and out.shape[1] != 1:
        raise ModelError(
            f'[tensor].output = "value" needs one output per row; the model gives {out.shape[1]}'
        )
    return out


class FeatureEncoding:
    """tensor's encoding: each row's features as one float32 matrix row, one unit per row with
    no length (batches are cut by `[batching].max_rows`). Needs no model file at all."""

    bucketing = False

    def __init__(
        self, path: Path, *, model: ModelConfig, options: TensorConfig, inp: InputConfig
    ) -> None:
        self.num_features = options.num_features
        self.inputs = tuple(inp.features)

    def encode(self, table: pa.Table) -> Encoded:
        matrix, rows, errors = feature_matrix(table, self.inputs, self.num_features)
        n = len(rows)
        ones = np.ones(n, dtype=np.int64)  # one "token" per row: batches are cut by max_rows
        return Encoded(ones, np.arange(n, dtype=np.int64), rows, errors, extra={"x": matrix})


class TensorTask(Adapter):
    """tensor: `prediction` (int64 class or float32 value) and `scores` (the raw output row)."""

    encoding_type = FeatureEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {c: "numeric" for c in inp.features}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("prediction", "scores")

    @classmethod
    def check_files(cls, path: Path, options: TensorConfig, *, allow_pickle: bool) -> None:
        check_tensor_model(path, options)  # a file of its own formats (`numeric.formats`)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: TensorConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.set_up(path, model=model, options=options, inp=inp)
        self.model = load_model(path, options, executor)
        self.executor = executor
        self.value = options.output == "value"
        kind = pa.float32() if self.value else pa.int64()
        self.width = self.output_width(input_width(inp, options))
        scores = pa.list_(pa.float32(), self.width) if self.width else pa.list_(pa.float32())
        self.columns = fields(self.output_names(options), {"prediction": kind, "scores": scores})

    def output_width(self, features: int | None) -> int | None:
        """How many numbers the model returns per row, from one row of zeros, so `scores` is
        declared fixed-width before any data is read. None when the input width is unknown
        (a list column of any length without num_features, which no row can be scored from)."""
        if not features:
            return None
        zeros = torch.zeros(1, features, dtype=self.executor.dtype, device=self.executor.device)
        try:
            with torch.inference_mode():
                return int(output_rows(self.model(zeros), self.value).shape[1])
        except RuntimeError as exc:
            raise ModelError(
                f"the model does not take rows of {features} features ({exc}); check "
                "[input].features or [tensor].num_features"
            ) from exc

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """The raw output rows [rows, k], float32 on the host."""
        x = self.executor.tensor(encoded.extra["x"][batch]).to(self.executor.dtype)
        out = output_rows(self.model(x), self.value)
        return out.float().cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        n = len(encoded.rows)
        width = self.width or (results.shape[1] if results.ndim == 2 else 1)  # rows or none
        scores = results.reshape(n, width).astype(np.float32)
        prediction = scores[:, 0] if self.value else scores.argmax(axis=1).astype(np.int64)
        return {
            "prediction": pa.array(prediction, type=self.columns[0].type),
            "scores": vectors_to_arrow(scores, width),
        }

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        if self.value:
            return agreement.values(reference, candidate, "prediction", gate)
        return agreement.classes(reference, candidate, "prediction", gate)
