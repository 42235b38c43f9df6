"""The classify task: a Hugging Face sequence-classification model's label and its probability.

Probabilities are the softmax of the logits, or per-label sigmoids for a model whose config says
``problem_type = "multi_label_classification"``; labels are the model's own ``id2label`` names.
With `[input].text_pair`, each row is read as a pair of texts, as cross-encoders and NLI models
are trained to read them (with their segment ids). With `[model].long_text = "chunk"`, a long
text (a pair's second text) is read in windows and its probabilities are the windows' mean.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import ModelError
from batchscore.job.sections import ClassifyConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields, pair_rows, text_rows
from batchscore.models.embed import vectors_to_arrow
from batchscore.models.locate import load_pretrained
from batchscore.models.text import TextEncoder
from batchscore.models.windows import mean_by_owner
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded


def load_classifier(path: Path, model: ModelConfig, executor: Executor) -> torch.nn.Module:
    """The model, cast and placed by the executor; refuses an untrained head or a regression one."""
    from transformers import AutoModelForSequenceClassification

    # complete: a bare encoder would get a random head, and confident-looking random labels
    module = load_pretrained(AutoModelForSequenceClassification, path, model, executor, True)
    config = module.config
    if config.num_labels < 2 or config.problem_type == "regression":
        raise ModelError(f"{path}: a regression head (one output), not a classifier")
    return executor.prepare(module)


class ClassifyEncoding:
    """classify's encoding: one unit per row, a text or (with `[input].text_pair`) a pair of
    texts with its segments; with `[model].long_text = "chunk"`, a long text's windows."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: ClassifyConfig, inp: InputConfig
    ) -> None:
        self.encoder = TextEncoder(path, model.max_length, model.trust_remote_code)
        self.chunk = model.long_text == "chunk"
        self.inputs = (inp.text, inp.text_pair) if inp.text_pair else (inp.text,)

    def encode(self, table: pa.Table) -> Encoded:
        """One unit per row (a pair's joint tokens, which the sampler buckets by), or windows."""
        if len(self.inputs) == 1:
            texts, rows, errors = text_rows(table, self.inputs[0])
            return self.encoder.tokens(texts, chunk=self.chunk).encoded(rows, errors)
        firsts, seconds, rows, errors = pair_rows(table, *self.inputs)
        tokens = self.encoder.pairs(firsts, seconds, chunk=self.chunk)
        named = f"columns {self.inputs[0]!r} and {self.inputs[1]!r}"
        tokens.errors = {t: f"{named}: {m}" for t, m in tokens.errors.items()}
        if not self.encoder.types:  # a model without segment embeddings (RoBERTa, say)
            tokens.type_ids = None
        return tokens.encoded(rows, errors)


class ClassifyTask(Adapter):
    """classify: `label` (string) and `score` (float32), plus `scores` with ``all_scores``."""

    encoding_type = ClassifyEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.text: "text", **({inp.text_pair: "text"} if inp.text_pair else {})}

    @classmethod
    def output_names(cls, options: ClassifyConfig) -> tuple[str, ...]:
        return ("label", "score", "scores") if options.all_scores else ("label", "score")

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: ClassifyConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.encoding = self.encoding_type(path, model=model, options=options, inp=inp)
        self.inputs, self.bucketing = self.encoding.inputs, self.encoding.bucketing
        self.encoder = self.encoding.encoder
        self.model = load_classifier(path, model, executor)
        self.executor = executor
        config = self.model.config
        self.labels = np.array([config.id2label[i] for i in range(config.num_labels)], object)
        self.multi_label = config.problem_type == "multi_label_classification"
        self.all_scores = options.all_scores
        scores = pa.list_(pa.float32(), len(self.labels))
        types = {"label": pa.string(), "score": pa.float32(), "scores": scores}
        self.columns = fields(self.output_names(options), types)

    def encode(self, table: pa.Table) -> Encoded:
        return self.encoding.encode(table)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """Probabilities [units, labels], float32 on the host; padding is masked out."""
        input_ids, mask = self.encoder.collate([encoded.ids[i] for i in batch])
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if encoded.type_ids is not None:
            types = [encoded.type_ids[i] for i in batch]
            inputs["token_type_ids"] = self.encoder.collate_types(types, mask)
        logits = self.model(**{k: self.executor.tensor(v) for k, v in inputs.items()}).logits
        logits = logits.float()
        probs = logits.sigmoid() if self.multi_label else logits.softmax(dim=-1)
        return probs.cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        probs = results.reshape(len(encoded.owners), len(self.labels)).astype(np.float32)
        if len(encoded.owners) != len(encoded.rows):  # a long text's windows: their mean
            probs = mean_by_owner(probs, encoded.owners, len(encoded.rows))
        best = probs.argmax(axis=1)
        columns = {
            "label": pa.array(self.labels[best], type=pa.string()),
            "score": pa.array(probs[np.arange(len(best)), best], type=pa.float32()),
        }
        if self.all_scores:
            columns["scores"] = vectors_to_arrow(probs, len(self.labels))
        return columns

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        probabilities = "scores" if self.all_scores else "score"
        return agreement.labels(reference, candidate, probabilities, gate)
