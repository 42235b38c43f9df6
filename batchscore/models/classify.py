"""The classify task: a Hugging Face sequence-classification model's label and its probability,
or a reranker's score.

Probabilities are the softmax of the logits, or per-label sigmoids for a model whose config says
``problem_type = "multi_label_classification"``; labels are the model's own ``id2label`` names.
A one-logit model is a cross-encoder reranker (ms-marco-MiniLM, bge-reranker): with
`[input].text_pair` it writes one ``score`` per row, its logit through the activation
sentence-transformers' ``CrossEncoder.predict`` applies (`stack/crossencoder.py`), and no label.
With `[input].text_pair`, each row is read as a pair of texts, as cross-encoders and NLI models
are trained to read them (with their segment ids). With `[model].long_text = "chunk"`, a long
text (a pair's second text) is read in windows: a classifier's probabilities are the windows'
mean, a reranker's score is its best window's (a passage is as relevant as its most relevant
part; a mean would let a long passage's other windows drown the one that answers the query).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import ModelError
from batchscore.job.sections import ClassifyConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields, vectors_to_arrow
from batchscore.models.source.locate import check_model_files, load_pretrained
from batchscore.models.stack.crossencoder import (
    activation_module,
    activation_name,
    read_cross_encoder,
)
from batchscore.models.stack.stack import read_json
from batchscore.models.text.inputs import pair_rows, text_rows
from batchscore.models.text.text import TextEncoder
from batchscore.models.text.windows import mean_by_owner
from batchscore.output.contents import LABELS
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded


def load_classifier(path: Path, model: ModelConfig, executor: Executor) -> torch.nn.Module:
    """The model, cast and placed by the executor; refuses an untrained head."""
    from transformers import AutoModelForSequenceClassification

    # complete: a bare encoder would get a random head, and confident-looking random labels
    module = load_pretrained(AutoModelForSequenceClassification, path, model, executor, True)
    return executor.prepare(module)


def outputs(config: dict[str, Any]) -> int:
    """How many logits a Hugging Face ``config.json`` gives its model, read before loading it:
    as many as ``id2label`` names, else ``num_labels``, else 2 (transformers' default)."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels") or 2)


def label_names(config: dict[str, Any]) -> list[str]:
    """A classifier's label names in logit (and `scores`) order, from its ``config.json`` as
    transformers reads it: ``id2label`` by id, else ``LABEL_0``, ``LABEL_1``, ..."""
    named = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    return [named.get(i, f"LABEL_{i}") for i in range(outputs(config))]


def check_head(
    path: Path, logits: int, problem: str | None, options: ClassifyConfig, inp: InputConfig | None
) -> None:
    """Refuse a head the job cannot use: a regression over several outputs, a reranker's score
    asked for `scores` or read from one text, an activation for a classifier's probabilities.
    ``inp`` None: what `validate` can check without the input section."""
    if logits > 1 and problem == "regression":
        raise ModelError(
            f"{path}: a regression head of {logits} outputs, neither a classifier nor a "
            "one-logit reranker"
        )
    if logits > 1 and options.activation != "auto":
        raise ModelError(
            f"[classify].activation: {path} is a classifier of {logits} labels, whose scores "
            "are their probabilities; activation applies to one-logit models (rerankers)"
        )
    if logits == 1 and options.all_scores:
        raise ModelError(
            f"[classify].all_scores: {path} has one output (a reranker), which its `score` "
            "column holds whole; remove all_scores"
        )
    if logits == 1 and inp is not None and inp.text_pair is None:
        raise ModelError(
            f"{path}: a one-logit model (a reranker) scores pairs of texts; set "
            "[input].text_pair to the column of the second text (the passage)"
        )


class ClassifyEncoding:
    """classify's encoding: one unit per row, a text or (with `[input].text_pair`) a pair of
    texts with its segments; with `[model].long_text = "chunk"`, a long text's windows. The
    texts are read as CrossEncoder reads them: a sentence-transformers 6 folder's default
    prompt before the first, lowercased where its Transformer says so."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: ClassifyConfig, inp: InputConfig
    ) -> None:
        self.folder = read_cross_encoder(path)
        self.encoder = TextEncoder(
            self.folder.encoder,
            model.max_length,
            model.trust_remote_code,
            lowercase=self.folder.lowercase,
        )
        self.chunk = model.long_text == "chunk"
        self.inputs = (inp.text, inp.text_pair) if inp.text_pair else (inp.text,)
        self.prompt = self.folder.prompt
        self.head = self.encoder.prompt_tokens(self.prompt)[0] if self.prompt else 0

    def encode(self, table: pa.Table) -> Encoded:
        """One unit per row (a pair's joint tokens, which the sampler buckets by), or windows."""
        if len(self.inputs) == 1:
            texts, rows, errors = text_rows(table, self.inputs[0])
            texts = [self.prompt + text for text in texts] if self.prompt else texts
            tokens = self.encoder.tokens(texts, chunk=self.chunk, head=self.head)
            return tokens.encoded(rows, errors)
        firsts, seconds, rows, errors = pair_rows(table, *self.inputs)
        firsts = [self.prompt + text for text in firsts] if self.prompt else firsts
        tokens = self.encoder.pairs(firsts, seconds, chunk=self.chunk)
        named = f"columns {self.inputs[0]!r} and {self.inputs[1]!r}"
        tokens.errors = {t: f"{named}: {m}" for t, m in tokens.errors.items()}
        if not self.encoder.types:  # a model without segment embeddings (RoBERTa, say)
            tokens.type_ids = None
        return tokens.encoded(rows, errors)


class Labels:
    """A classifier's head: probabilities, the label of the largest and its probability (and
    with ``all_scores`` every label's); a long text's windows meet at their mean."""

    def __init__(self, config: Any, names: tuple[str, ...]) -> None:
        self.labels = np.array([config.id2label[i] for i in range(config.num_labels)], object)
        self.multi_label = config.problem_type == "multi_label_classification"
        self.names = names
        self.all_scores = "scores" in names
        scores = pa.list_(pa.float32(), len(self.labels))
        self.types = {"label": pa.string(), "score": pa.float32(), "scores": scores}

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.sigmoid() if self.multi_label else logits.softmax(dim=-1)

    def finish(self, results: np.ndarray, owners: np.ndarray, rows: int) -> dict[str, pa.Array]:
        probs = results.reshape(len(owners), len(self.labels)).astype(np.float32)
        if len(owners) != rows:  # a long text's windows: their mean
            probs = mean_by_owner(probs, owners, rows)
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


class Score:
    """A reranker's head: its one logit through its activation (upcast to float32 first, as
    CrossEncoder does); a long passage's windows meet at their best."""

    names = ("score",)

    def __init__(self, activation: str) -> None:
        self.activation = activation_module(activation)
        self.types = {"score": pa.float32()}

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        return self.activation(logits)[:, 0]

    def finish(self, results: np.ndarray, owners: np.ndarray, rows: int) -> dict[str, pa.Array]:
        scores = results.reshape(len(owners)).astype(np.float32)
        if len(owners) != rows:  # a long passage's windows: the best of them
            best = np.full(rows, -np.inf, dtype=np.float32)
            np.maximum.at(best, owners, scores)
            scores = best
        return {"score": pa.array(scores, type=pa.float32())}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.scores(reference, candidate, "score", gate)


class ClassifyTask(Adapter):
    """classify: `label` (string) and `score` (float32), plus `scores` with ``all_scores``; a
    one-logit model (a reranker) writes `score` alone."""

    encoding_type = ClassifyEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.text: "text", **({inp.text_pair: "text"} if inp.text_pair else {})}

    @classmethod
    def output_names(cls, options: ClassifyConfig) -> tuple[str, ...]:
        """A classifier's columns; a reranker writes the one of them its `Score` names (which
        model a job runs is not known before it is found, so a job's other columns are kept
        clear of all of these)."""
        return ("label", "score", "scores") if options.all_scores else ("label", "score")

    @classmethod
    def check_files(cls, path: Path, options: ClassifyConfig, *, allow_pickle: bool) -> None:
        """The folder as CrossEncoder reads it, its weights' files, and its head for the job."""
        if not path.is_dir():
            check_model_files(path, allow_pickle)  # which says a folder is needed
        folder = read_cross_encoder(path)
        check_model_files(folder.encoder, allow_pickle)
        config = read_json(folder.encoder / "config.json")
        logits = outputs(config)
        check_head(path, logits, config.get("problem_type"), options, None)
        if logits == 1 and options.activation == "auto":
            folder.activation()  # an activation batchscore does not implement: refused now

    @classmethod
    def footer_metadata(cls, path: Path, options: object) -> dict[str, str]:
        """A classifier's label names, in the order of its `scores` (`batchscore.labels`, a
        JSON list): the `scores` vector reads without the model's config. A reranker's one
        `score` has no names."""
        config = read_json(read_cross_encoder(path).encoder / "config.json")
        if outputs(config) == 1:
            return {}
        return {LABELS: json.dumps(label_names(config), ensure_ascii=False)}

    @classmethod
    def fingerprint_parts(cls, model: ModelConfig, path: Path, options: object) -> dict[str, Any]:
        """A prompt or lowercasing the folder asks for (recorded only then, so outputs made
        before batchscore read them still resume)."""
        folder = read_cross_encoder(path) if path.is_dir() else None
        if folder is None or folder.plain:
            return {}
        return {"cross_encoder": {"prompt": folder.prompt, "lowercase": folder.lowercase}}

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: ClassifyConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.set_up(path, model=model, options=options, inp=inp)
        self.encoder = self.encoding.encoder
        folder = self.encoding.folder
        written = read_json(folder.encoder / "config.json")  # before seconds of loading
        check_head(path, outputs(written), written.get("problem_type"), options, inp)
        self.model = load_classifier(folder.encoder, model, executor)
        self.executor = executor
        config = self.model.config
        check_head(path, config.num_labels, config.problem_type, options, inp)
        if config.num_labels == 1:
            chosen = activation_name(folder, options.activation, model.trust_remote_code)
            self.head: Labels | Score = Score(chosen)
        else:
            self.head = Labels(config, self.output_names(options))
        self.columns = fields(self.head.names, self.head.types)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """Probabilities [units, labels] or scores [units], float32 on the host; padding is
        masked out."""
        input_ids, mask = self.encoder.collate([encoded.ids[i] for i in batch])
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if encoded.type_ids is not None:
            types = [encoded.type_ids[i] for i in batch]
            inputs["token_type_ids"] = self.encoder.collate_types(types, mask)
        logits = self.model(**{k: self.executor.tensor(v) for k, v in inputs.items()}).logits
        values = self.head.activate(logits.float())
        return values.cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return self.head.finish(results, encoded.owners, len(encoded.rows))

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return self.head.agreement(reference, candidate, gate)
