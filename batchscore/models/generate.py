"""The generate task: seq2seq (T5, BART) and decoder-only (GPT-2 style) text generation.

Whether a folder holds a generative model, and of which kind, is read from its config
(`generation/architecture.py`), never from a name. Prompts are padded on the side
the architecture needs so padding cannot change a row's output: an encoder reads right-padded
rows under its attention mask, a decoder-only model continues left-padded rows (positions come
from the mask), and each row's new tokens end at its first EOS or stop string. `transformers`'
``generate`` does the decoding, with its KV cache. With `[generate].chat` each row's prompt is
the user turn of the model's chat template (`batchscore.models.generation.chat`). With
`[generate].json_schema`, `choices` or `regex` each row's tokens follow a grammar
(`generation/constraint.py`) and its value is written parsed, in `parsed`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import ModelError
from batchscore.job.sections import GenerateConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields
from batchscore.models.generation.architecture import generative_kind, read_config
from batchscore.models.generation.chat import Chat, has_chat_template, no_template
from batchscore.models.generation.constraint import Constraint, Masking
from batchscore.models.generation.decode import (
    Decoding,
    Finite,
    Picker,
    RowSampler,
    eos_ids,
    generation_config,
    loop_decodes_alike,
    stop_strings,
    trim,
)
from batchscore.models.generation.schedule import Limits, Prefixes, Schedule
from batchscore.models.generation.seats import Forward, plain_cache
from batchscore.models.generation.stops import Stops
from batchscore.models.generation.structure import Structure
from batchscore.models.source.locate import load_pretrained
from batchscore.models.text.inputs import Prompt
from batchscore.models.text.text import TextEncoder
from batchscore.runtime.executor import Executor
from batchscore.work.row_errors import COLUMN
from batchscore.work.units import Encoded


class PromptEncoding:
    """generate's encoding: one prompt per row (in the model's chat template when the job asks),
    cut on the side the architecture continues from (a decoder's start, keeping the end it
    continues), with room kept for the new tokens."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: GenerateConfig, inp: InputConfig
    ) -> None:
        trust = model.trust_remote_code
        kind = generative_kind(read_config(path, trust))
        if kind is None:
            raise ModelError(f"{path}: not a text-generation model (see its config.json)")
        self.seq2seq = kind == "seq2seq"
        self.new_tokens = options.max_new_tokens
        reserve = 0 if self.seq2seq else self.new_tokens  # decoders share positions
        self.encoder = TextEncoder(path, model.max_length, trust, reserve, not self.seq2seq)
        self.prompt = Prompt(options.prompt, inp.text)
        self.inputs = self.prompt.columns
        # [summarize] has no chat keys: an abstractive summary's prompt is the model's own format
        chat = getattr(options, "chat", False)
        messages = getattr(options, "messages", False)
        self.chat = Chat(self.encoder.hf, options.system, path, messages=messages) if chat else None

    def encode(self, table: pa.Table) -> Encoded:
        texts, rows, errors = self.prompt.render(table)
        if self.chat is None:
            encoded = self.encoder.encode_rows(texts, rows, errors)
        else:
            encoded = self.chat.encode(self.encoder, texts, rows, errors)
        encoded.reserve = self.new_tokens
        return encoded

    @property
    def context(self) -> tuple[int, bool]:
        """The model's context in tokens, and whether new tokens share it with the prompt
        (a decoder-only model's do; a seq2seq decoder has positions of its own)."""
        return self.encoder.window, not self.seq2seq

    def whole_lengths(self, table: pa.Table) -> dict[int, int]:
        """Each row's prompt length in tokens before any cut, by row (rows whose prompt or
        chat template refuses them are left out: scoring says why): what a request is held
        to the model's context with, as OpenAI holds it, rather than cut to fit."""
        texts, rows, _ = self.prompt.render(table)
        special = self.chat is None  # a chat template writes its special tokens itself
        rendered = texts if self.chat is None else self.chat.render(texts)[0]
        kept = [i for i, text in enumerate(rendered) if text is not None]
        encodings = self.encoder.whole.encode_batch(
            [rendered[i] for i in kept], add_special_tokens=special
        )
        return {int(rows[i]): len(e.ids) for i, e in zip(kept, encodings, strict=True)}


class Generator:
    """A loaded generative model that turns prompt id batches into new token ids."""

    def __init__(
        self,
        prompts: PromptEncoding,
        *,
        model: ModelConfig,
        executor: Executor,
        decoding: Decoding,
        structure: Structure | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

        self.seq2seq = prompts.seq2seq
        self.encoder = prompts.encoder
        auto = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
        module = load_pretrained(auto, prompts.encoder.path, model, executor, complete=True)
        self.model = executor.prepare(module)
        self.executor = executor
        self.decoding = decoding
        self.eos = eos_ids(module.generation_config)
        pad = self.encoder.hf.pad_token_id
        pad = pad if pad is not None else min(self.eos, default=self.encoder.pad_id)
        self.encoder.pad_id = pad
        self.config = generation_config(module.generation_config, decoding, pad)
        forced = self.config.forced_eos_token_id
        self.forced_eos = {forced} if isinstance(forced, int) else set(forced or [])
        strings = stop_strings(module.generation_config, decoding)
        self.stops = Stops(strings, self.encoder.hf, self.encoder.path) if strings else None
        # what a seq2seq decoder's tokens follow, as generate starts them: a stop string may
        # begin there as it may in a decoder-only model's prompt
        start = self.config.decoder_start_token_id
        start = start if start is not None else self.config.bos_token_id
        self.start = np.asarray([start] if isinstance(start, int) else [], dtype=np.int64)
        # Continuous batching runs its own decoding loop: only where that loop decodes as
        # `generate` does (greedy or seeded sampling, no beams, no extra logits steps) over a
        # plain KV cache whose rows it may move. Seq2seq models and the rest batch statically.
        self.continuous = (
            not self.seq2seq and loop_decodes_alike(self.config) and plain_cache(self.model)
        )
        fp16 = executor.dtype == torch.float16  # its logits can overflow: guarded (`finite`)
        self.picker = Picker(decoding, self.config.repetition_penalty, guard=fp16)
        self.constraint = None
        if structure is not None:
            head = module.get_output_embeddings()
            vocab = head.weight.shape[0] if head is not None else module.config.vocab_size
            self.constraint = Constraint(
                structure.grammar(), self.encoder.hf, vocab=vocab, eos=self.eos
            )
        self.prefixes = Prefixes()  # the shared prompt start's cache, kept across windows

    def stream(
        self, ids: list[np.ndarray], *, max_tokens: int, max_rows: int, reuse_prefix: bool = True
    ) -> Schedule:
        """Continuous batching over prompts ``ids``, seated in their order under the budget
        (only when `continuous`); iterate it for (index into ids, new token ids) as rows end."""
        limits = Limits(self.eos, self.decoding.max_new_tokens, max_tokens, max_rows, self.stops)
        return Schedule(
            Forward(self.model),
            ids,
            picker=self.picker,
            limits=limits,
            prefixes=self.prefixes if reuse_prefix else None,
            cut=self.encoder.max_length,
            constraint=self.constraint,
        )

    def forward(self, ids: list[np.ndarray]) -> np.ndarray:
        """Generate for one static batch with `generate`; returns each row's new token ids (an
        object array)."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        input_ids, mask = self.encoder.collate(ids, left=not self.seq2seq)
        processors = LogitsProcessorList([Finite()] if self.picker.guard else [])
        if self.constraint is not None:  # before the sampler: it draws from what is allowed
            processors.append(Masking(self.constraint, len(ids)))
        if self.decoding.do_sample:
            processors.append(RowSampler(self.decoding, ids))
        criteria = StoppingCriteriaList()
        if self.stops is not None:  # a seq2seq decoder's ids have no padding to hide
            padding = np.zeros(len(ids)) if self.seq2seq else (mask == 0).sum(axis=1)
            criteria.append(self.stops.criteria(padding))
        out = self.model.generate(
            input_ids=self.executor.tensor(input_ids),
            attention_mask=self.executor.tensor(mask),
            generation_config=self.config,
            logits_processor=processors,
            stopping_criteria=criteria,
        )
        # seq2seq output starts with the decoder's start token; a decoder's repeats the prompt
        new = out[:, 1:] if self.seq2seq else out[:, input_ids.shape[1] :]
        tokens = trim(new.cpu().numpy(), self.eos)  # the device-to-host copy: a sync point
        if self.stops is not None:  # a row stopped by a string is padded after it: cut there
            for i, context in enumerate(self.contexts(ids)):
                end = self.stops.first(context, tokens[i])
                tokens[i] = tokens[i][:end] if end is not None else tokens[i]
        return tokens

    def contexts(self, ids: list[np.ndarray]) -> list[np.ndarray]:
        """What each row's new tokens follow, for prompts ``ids``: the prompt in a decoder-only
        model, the decoder's start token in a seq2seq one."""
        return [self.start] * len(ids) if self.seq2seq else list(ids)

    def finish_reasons(self, tokens: list[np.ndarray], contexts: list[np.ndarray]) -> list[str]:
        """ "eos" when a row chose to stop, "stop" when its last token completed a stop string
        (after ``contexts``, see `contexts`), "length" when max_new_tokens stopped it.

        A model that forces EOS at the length limit (BART's ``forced_eos_token_id``) ends such
        rows with an EOS it did not choose; those count as "length".
        """
        limit = self.decoding.max_new_tokens
        stopped = np.zeros(len(tokens), dtype=bool)
        if self.stops is not None and len(tokens):
            window = self.stops.window
            pairs = zip(contexts, tokens, strict=True)
            tails = [np.concatenate([c[-window:], t[-window:]]) for c, t in pairs]
            stopped = self.stops.hits(tails) & np.array([len(t) > 0 for t in tokens])
        reasons = []
        for row, stop in zip(tokens, stopped, strict=True):
            ended = len(row) > 0 and int(row[-1]) in self.eos
            forced = len(row) == limit and ended and int(row[-1]) in self.forced_eos
            reasons.append("eos" if ended and not forced else "stop" if stop else "length")
        return reasons

    def written(
        self, tokens: list[np.ndarray], contexts: list[np.ndarray], reasons: list[str]
    ) -> list[str]:
        """Each row's text: its tokens decoded, cut before the stop string that ended it."""
        hf = self.encoder.hf
        texts = hf.batch_decode([t.tolist() for t in tokens], skip_special_tokens=True)
        for i, reason in enumerate(reasons):
            if reason == "stop" and self.stops is not None:
                head = contexts[i][-self.stops.window :].tolist()
                texts[i] = self.stops.cut(texts[i], hf.decode(head, skip_special_tokens=True))
        return texts


class GenerateTask(Adapter):
    """generate: `generated` (string), `prompt_tokens`, `generated_tokens`, `finish_reason`,
    and under structured generation `parsed` (the value; `Structure.arrow_type`)."""

    encoding_type = PromptEncoding  # the weight-free part (`models.tasks.encoding` builds it)
    column = "generated"
    usage_names = ()  # its own columns count the tokens it read and wrote

    @staticmethod
    def input_kinds(inp: InputConfig, options: Any) -> dict[str, str]:
        return {c: "text" for c in Prompt(options.prompt, inp.text).columns}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        parsed = ("parsed",) if Structure.of(options) is not None else ()
        return (cls.column, *parsed, "prompt_tokens", "generated_tokens", "finish_reason")

    @classmethod
    def generates(cls, model: ModelConfig, path: Path) -> bool:
        return True

    @classmethod
    def check_files(cls, path: Path, options: Any, *, allow_pickle: bool) -> None:
        """The model's files, its chat template when the job asks for one, and the grammar of
        structured generation (a `JobError` for a schema or regex it cannot satisfy)."""
        super().check_files(path, options, allow_pickle=allow_pickle)
        if getattr(options, "chat", False) and not has_chat_template(path):
            raise no_template(path)
        structure = Structure.of(options)
        if structure is not None:
            structure.grammar()

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: GenerateConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        self.set_up(path, model=model, options=options, inp=inp)
        self.structure = Structure.of(options)
        self.generator = Generator(
            self.encoding,
            model=model,
            executor=executor,
            decoding=Decoding.of(options),
            structure=self.structure,
        )
        types = {
            self.column: pa.string(),
            "parsed": self.structure.arrow_type() if self.structure else pa.string(),
            "prompt_tokens": pa.int32(),
            "generated_tokens": pa.int32(),
            "finish_reason": pa.string(),
        }
        self.columns = fields(self.output_names(options), types)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return self.generator.forward([encoded.ids[i] for i in batch])

    @property
    def continuous(self) -> bool:
        """Whether `stream` can run this task's rows: decoder-only generation (see `Generator`)."""
        return self.generator.continuous

    def stream(
        self,
        encoded: Encoded,
        units: np.ndarray,
        *,
        max_tokens: int,
        max_rows: int,
        reuse_prefix: bool,
    ) -> Schedule:
        """Continuous batching over ``units`` in their order; yields (index into units, tokens)."""
        ids = [encoded.ids[u] for u in units]
        return self.generator.stream(
            ids, max_tokens=max_tokens, max_rows=max_rows, reuse_prefix=reuse_prefix
        )

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        tokens = [np.asarray(t, dtype=np.int64) for t in results]
        contexts = self.generator.contexts(encoded.ids)
        reasons = self.generator.finish_reasons(tokens, contexts)
        texts = self.generator.written(tokens, contexts, reasons)
        columns = {
            self.column: pa.array(texts, type=pa.string()),
            "prompt_tokens": pa.array(encoded.lengths, type=pa.int32()),
            "generated_tokens": pa.array([len(t) for t in tokens], type=pa.int32()),
            "finish_reason": pa.array(reasons, type=pa.string()),
        }
        if self.structure is not None:
            columns |= self.parsed(tokens, texts)
        return columns

    def parsed(self, tokens: list[np.ndarray], texts: list[str]) -> dict[str, pa.Array]:
        """The `parsed` column, and an `error` for each row whose tokens ended before its value
        did (max_new_tokens, or a stop string): never a value cut short written as if whole;
        and for a value that does not fit its column (`Structure.parse`)."""
        constraint, eos = self.generator.constraint, self.generator.eos
        whole = [constraint.complete(t, eos) for t in tokens]
        errors = [
            None
            if ok
            else f"[generate].{self.structure.key}: the value was not complete after "
            f"{len(t)} new tokens; raise [generate].max_new_tokens (or drop a stop string)"
            for ok, t in zip(whole, tokens, strict=True)
        ]
        values = [text if ok else None for ok, text in zip(whole, texts, strict=True)]
        parsed, failed = self.structure.parse(values)
        for row, message in failed.items():
            errors[row] = message
        return {"parsed": parsed, COLUMN: pa.array(errors, pa.string())}

    def usage(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        """{}: `finish` counts them (`prompt_tokens`, `generated_tokens`)."""
        return {}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.texts(reference, candidate, self.column, gate)


class AbstractiveSummarizeTask(GenerateTask):
    """summarize with a generative model: one `summary` (string) per row, the same contract as
    the extractive default."""

    column = "summary"
    usage_names = ("prompt_tokens", "generated_tokens")  # generate's, kept with [output].usage

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return (cls.column,)
