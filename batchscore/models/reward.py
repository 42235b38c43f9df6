"""The reward task: a sequence-classification reward model's score of each row's conversation.

A reward model (Skywork-Reward, ArmoRM, the RLHF reward models transformers loads as
``...ForSequenceClassification``) reads a whole conversation in its chat template and scores
it from its last token. Each row's conversation is `[input].messages` (a list of {role,
content}, or its JSON text), or `[input].text` and `text_pair` read as one user turn and one
assistant turn; it is rendered as its model card renders it,
``apply_chat_template(messages, tokenize=False)`` (no generation prompt: the answer is there),
and tokenized with no special tokens added, since the template writes them. A conversation
the template refuses, or one longer than the model's window, is that row's error (never cut:
the score is read from its end). The score is the raw logit in float32: `reward` for a
one-logit model, else a struct of float32 named by the model's labels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import ModelError
from batchscore.job.lm_sections import RewardConfig
from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields
from batchscore.models.classify import label_names, load_classifier
from batchscore.models.generation.chat import has_chat_template, read_messages
from batchscore.models.stack.stack import read_json
from batchscore.models.text.inputs import pair_rows
from batchscore.models.text.text import TextEncoder
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded


def no_template(path: Path) -> ModelError:
    return ModelError(
        f'[model].task = "reward": {path} has no chat template (in tokenizer_config.json or '
        "chat_template.jinja), which a reward model reads its conversation through; add the "
        "template its card names to the folder"
    )


def reward_type(labels: list[str]) -> pa.DataType:
    """float32 for one logit; a struct of float32 named by the labels for several."""
    if len(labels) == 1:
        return pa.float32()
    return pa.struct([pa.field(name, pa.float32()) for name in labels])


class Conversations:
    """Each row's conversation, from a `messages` column or a prompt and a response."""

    def __init__(self, inp: InputConfig) -> None:
        self.messages = inp.messages
        self.inputs = (inp.messages,) if inp.messages else (inp.text, inp.text_pair)

    def read(self, table: pa.Table) -> tuple[list[list[dict]], np.ndarray, dict[int, str]]:
        """The rows' conversations, the rows they come from, and an error per other row."""
        if self.messages is None:
            prompts, responses, rows, errors = pair_rows(table, *self.inputs)
            pairs = zip(prompts, responses, strict=True)
            turns = [[user(p), {"role": "assistant", "content": r}] for p, r in pairs]
            return turns, rows, errors
        column = table.column(self.messages)
        found: list[list[dict]] = []
        rows, errors = [], {}
        for row, value in enumerate(column.to_pylist()):
            try:
                found.append(conversation(value))
            except ValueError as exc:
                errors[row] = f"column {self.messages!r} ([input].messages): {exc}"
                continue
            rows.append(row)
        return found, np.asarray(rows, dtype=np.int64), errors


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def conversation(value: Any) -> list[dict[str, str]]:
    """A row's messages, from a list of structs or from JSON text; ValueError if not one."""
    if value is None:
        raise ValueError("the conversation is null")
    if isinstance(value, bytes | str):
        try:
            return read_messages(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of messages ({exc})") from exc
    if not value:
        raise ValueError("expected a non-empty list of messages")
    for message in value:
        if not isinstance(message, dict) or message.get("role") is None:
            raise ValueError(f"expected messages with a role and a content, got {message!r}")
        if message.get("content") is None:
            raise ValueError(f"a {message['role']} message has no content")
    return [{"role": m["role"], "content": m["content"]} for m in value]


class RewardEncoding:
    """reward's encoding: one unit per row, its conversation rendered through the model's
    chat template and tokenized whole."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: RewardConfig, inp: InputConfig
    ) -> None:
        if not has_chat_template(path):
            raise no_template(path)
        self.encoder = TextEncoder(path, model.max_length, model.trust_remote_code)
        self.conversations = Conversations(inp)
        self.inputs = self.conversations.inputs
        self.key = "[input].messages" if inp.messages else "[input].text and text_pair"

    def render(self, turns: list[list[dict]]) -> tuple[list[str | None], dict[int, str]]:
        """Each conversation rendered (None where the template refuses it, and why)."""
        template = self.encoder.hf.apply_chat_template
        try:
            return list(template(turns, tokenize=False)), {}
        except Exception:  # find the rows it refuses, one at a time
            rendered: list[str | None] = []
            errors: dict[int, str] = {}
            for i, turn in enumerate(turns):
                try:
                    rendered.append(template([turn], tokenize=False)[0])
                except Exception as exc:  # the template's own raise_exception, or Jinja's
                    rendered.append(None)
                    errors[i] = f"{self.key}: the model's chat template refuses it: {exc}"
            return rendered, errors

    def encode(self, table: pa.Table) -> Encoded:
        turns, rows, errors = self.conversations.read(table)
        rendered, refused = self.render(turns)
        window = self.encoder.max_length
        kept = [i for i in range(len(turns)) if i not in refused]
        encodings = self.encoder.whole.encode_batch(
            [rendered[i] for i in kept], add_special_tokens=False
        )
        ids, owners, scored = [], [], []
        for i, encoding in zip(kept, encodings, strict=True):
            if len(encoding.ids) > window:
                refused[i] = (
                    f"{self.key}: the conversation takes {len(encoding.ids)} tokens, more than "
                    f"the model's window of {window} ([model].max_length); its score is read "
                    "from its end, so it is not cut"
                )
                continue
            ids.append(np.asarray(encoding.ids, dtype=np.int64))
            owners.append(len(scored))
            scored.append(int(rows[i]))
        errors = {**errors, **{int(rows[i]): message for i, message in refused.items()}}
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        owned = np.asarray(owners, dtype=np.int64)
        return Encoded(lengths, owned, np.asarray(scored, dtype=np.int64), errors, ids)


class RewardTask(Adapter):
    """reward: `reward` (float32, or a struct of float32 named by the model's labels)."""

    encoding_type = RewardEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        if inp.messages:
            return {inp.messages: "messages"}
        return {inp.text: "text", **({inp.text_pair: "text"} if inp.text_pair else {})}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("reward",)

    @classmethod
    def check_files(cls, path: Path, options: Any, *, allow_pickle: bool) -> None:
        """The weights' files, a sequence classifier's config, and the chat template."""
        super().check_files(path, options, allow_pickle=allow_pickle)
        if not path.is_dir():
            return
        architectures = read_json(path / "config.json").get("architectures") or []
        if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
            raise ModelError(
                f'[model].task = "reward": {path} is not a sequence-classification model '
                f"({', '.join(map(str, architectures)) or 'no architectures'} in its "
                "config.json); a reward model scores from such a head"
            )
        if not has_chat_template(path):
            raise no_template(path)

    @classmethod
    def footer_metadata(cls, path: Path, options: object) -> dict[str, str]:
        return {}

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: RewardConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.set_up(path, model=model, options=options, inp=inp)
        self.model = load_classifier(path, model, executor)
        self.executor = executor
        config = self.model.config
        self.labels = label_names(config.to_dict())
        # a batch is padded with the pad token, so the model finds each row's last token as it
        # does alone; a model without one (transformers then refuses batches) scores rows alone
        self.pad = config.pad_token_id
        if self.pad is not None:
            self.encoding.encoder.pad_id = self.pad
        self.columns = fields(("reward",), {"reward": reward_type(self.labels)})

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """Logits [units, labels], float32 on the host."""
        ids = [encoded.ids[i] for i in batch]
        groups = [ids] if self.pad is not None else [[one] for one in ids]
        out = []
        for group in groups:
            input_ids, mask = self.encoding.encoder.collate(group)
            tensor = self.executor.tensor
            logits = self.model(input_ids=tensor(input_ids), attention_mask=tensor(mask)).logits
            out.append(logits.float())
        return torch.cat(out).cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        values = results.reshape(len(encoded.owners), len(self.labels)).astype(np.float32)
        ordered = np.empty_like(values)
        ordered[encoded.owners] = values
        if len(self.labels) == 1:
            return {"reward": pa.array(ordered[:, 0], type=pa.float32())}
        arrays = [pa.array(ordered[:, i], type=pa.float32()) for i in range(len(self.labels))]
        return {"reward": pa.StructArray.from_arrays(arrays, names=self.labels)}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        if len(self.labels) == 1:
            return agreement.scores(reference, candidate, "reward", gate)
        return agreement.named_scores(reference, candidate, "reward", gate)
