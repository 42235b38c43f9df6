"""The loglik task: a causal language model's log-likelihood of each row, as
lm-evaluation-harness computes it.

Over a text (`[input].text` alone), every token of the text is scored, the first one predicted
from the tokenizer's BOS token (its rolling log-likelihood): `logprob` is the sum of the
tokens' log-probabilities, `tokens` their count and `perplexity` exp(-logprob / tokens). A
text longer than the model's window is scored in strided windows (`text/windows.strided`),
each token once. Over a context and a continuation (`[input].text_pair`), the continuation's
tokens are scored given the context, with `is_greedy` (every one the model's argmax). The
boundary is lm-evaluation-harness's: spaces ending the context move to the continuation's
start, the two are encoded joined, and the continuation is what follows the context's own
encoding (an empty context: the BOS token alone). No special tokens are added besides.

Units are token ids with, in ``extra``, how many of their last tokens they score (and, with a
context, its length, so rows sharing one read its KV cache once: `generation/likelihood`);
forward returns per unit [sum, all greedy, targets] and, with `[loglik].token_logprobs`, its
targets' log-probabilities after them (0 past its own), a float64 matrix of fixed width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import ModelError
from batchscore.job.lm_sections import LoglikConfig
from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields
from batchscore.models.generation.architecture import generative_kind, read_config
from batchscore.models.generation.likelihood import Likelihood
from batchscore.models.source.locate import load_pretrained
from batchscore.models.text.inputs import text_rows, text_values
from batchscore.models.text.text import TextEncoder
from batchscore.models.text.windows import strided
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded

TYPES = {
    "logprob": pa.float64(),
    "tokens": pa.int32(),
    "perplexity": pa.float64(),
    "is_greedy": pa.bool_(),
    "token_logprobs": pa.list_(pa.float64()),
}
HEAD = 3  # forward's first columns: the sum, whether every target was greedy, the targets


def check_causal(path: Path, trust_remote_code: bool) -> None:
    """A decoder-only language model, read from its config (never its name)."""
    if generative_kind(read_config(path, trust_remote_code)) != "decoder":
        raise ModelError(
            f'[model].task = "loglik": {path} is not a decoder-only (causal) language model '
            "(see its config.json); loglik scores the tokens such a model predicts"
        )


def split(context: str, continuation: str) -> tuple[str, str]:
    """lm-evaluation-harness's boundary: the context's trailing spaces open the continuation."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        return context[:-spaces], context[-spaces:] + continuation
    return context, continuation


class LoglikEncoding:
    """loglik's encoding: a text's strided windows after its BOS token, or one unit per
    context and continuation (a row error where the two exceed the model's window)."""

    bucketing = True

    def __init__(
        self, path: Path, *, model: ModelConfig, options: LoglikConfig, inp: InputConfig
    ) -> None:
        check_causal(path, model.trust_remote_code)
        self.encoder = TextEncoder(path, model.max_length, model.trust_remote_code)
        self.window = self.encoder.max_length
        self.pair = inp.text_pair is not None
        self.inputs = (inp.text, inp.text_pair) if self.pair else (inp.text,)
        self.stride = options.stride or max(1, self.window // 2)
        self.bos = self.encoder.hf.bos_token_id
        if not self.pair and self.stride >= self.window:
            raise ModelError(
                f"[loglik].stride: {self.stride} tokens, but each window of "
                f"{self.window} ([model].max_length) must keep context before what it scores; "
                f"set a stride below {self.window}"
            )
        if not self.pair and self.bos is None:
            raise ModelError(
                f"[loglik]: {path}'s tokenizer has no BOS token, which a text's first token is "
                "predicted from; score contexts and continuations ([input].text_pair) instead"
            )
        self.width = HEAD + (self.window if options.token_logprobs else 0)

    def encode(self, table: pa.Table) -> Encoded:
        if self.pair:
            return self.pairs(table)
        column = self.inputs[0]
        texts, rows, errors = text_rows(table, column)
        ids, targets, owners, kept = [], [], [], []
        bos = np.asarray([self.bos], dtype=np.int64)
        for text, encoding in enumerate(self.whole(texts)):
            if not len(encoding):  # nothing the tokenizer keeps: no token to score
                errors[int(rows[text])] = f"column {column!r}: the text encodes to no token"
                continue
            sequence = np.concatenate([bos, encoding])
            for window, scored in strided(sequence, window=self.window, stride=self.stride):
                ids.append(window)
                targets.append(scored)
                owners.append(len(kept))
            kept.append(int(rows[text]))
        return self.units(ids, targets, owners, np.asarray(kept, dtype=np.int64), errors)

    def pairs(self, table: pa.Table) -> Encoded:
        """One unit per row: the context's encoding, then the continuation's tokens."""
        context, pair = self.inputs
        firsts, errors = text_values(table.column(context), context, blank_ok=True)
        seconds, more = text_values(table.column(pair), pair)
        errors = {**more, **errors}
        kept = [r for r in range(table.num_rows) if r not in errors]
        parts = [split(firsts[r], seconds[r]) for r in kept]
        joined = self.whole([a + b for a, b in parts])
        heads = self.whole([a for a, _ in parts])
        ids, targets, owners, contexts, rows = [], [], [], [], []
        for i, (row, whole, head) in enumerate(zip(kept, joined, heads, strict=True)):
            if not parts[i][0]:  # no context: the continuation after BOS alone
                head = np.asarray([] if self.bos is None else [self.bos], dtype=np.int64)
                whole = np.concatenate([head, self.whole([parts[i][1]])[0]])
            tail = whole[len(head) :]
            problem = self.pair_problem(len(head), len(tail), row)
            if problem:
                errors[row] = problem
                continue
            ids.append(np.concatenate([head, tail]))
            targets.append(len(tail))
            contexts.append(len(head))
            owners.append(len(rows))
            rows.append(row)
        encoded = self.units(ids, targets, owners, np.asarray(rows, np.int64), errors)
        encoded.extra["contexts"] = np.asarray(contexts, dtype=np.int64)
        return encoded

    def pair_problem(self, context: int, continuation: int, row: int) -> str | None:
        """Why a context and continuation of these token counts cannot be scored, if so."""
        names = f"columns {self.inputs[0]!r} and {self.inputs[1]!r}"
        if context == 0:
            return f"{names}: an empty context needs a BOS token, and the tokenizer has none"
        if continuation == 0:
            return f"column {self.inputs[1]!r}: the continuation adds no token to the context"
        if context + continuation > self.window:
            return (
                f"{names}: the context and continuation take {context + continuation} tokens, "
                f"more than the model's window of {self.window} ([model].max_length)"
            )
        return None

    def whole(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text, untruncated, with no special tokens."""
        encodings = self.encoder.whole.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    @staticmethod
    def units(
        ids: list[np.ndarray],
        targets: list[int],
        owners: list[int],
        rows: np.ndarray,
        errors: dict[int, str],
    ) -> Encoded:
        """An `Encoded` of these units; each is known (repeats, the gate's results) by its
        tokens and how many of them it scores."""
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        scored = np.asarray(targets, dtype=np.int64)
        pairs = zip(ids, targets, strict=True)
        keys = [unit.tobytes() + int(t).to_bytes(8, "little") for unit, t in pairs]
        owned = np.asarray(owners, dtype=np.int64)
        encoded = Encoded(lengths, owned, rows, errors, ids, extra={"keys": keys})
        encoded.extra["targets"] = scored
        return encoded


class LoglikTask(Adapter):
    """loglik: `logprob` (float64), `tokens` (int32) and `perplexity` (float64) over a text;
    `logprob`, `tokens` and `is_greedy` (bool) over a context and a continuation; with
    `[loglik].token_logprobs`, `token_logprobs` (list<float64>) after them."""

    encoding_type = LoglikEncoding  # the weight-free part (`models.tasks.encoding` builds it)

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.text: "text", **({inp.text_pair: "text"} if inp.text_pair else {})}

    @classmethod
    def output_names(cls, options: LoglikConfig) -> tuple[str, ...]:
        """Both modes' columns: which one a job runs is its [input]'s to say, and a job's other
        columns are kept clear of all of them (`columns` holds the mode's own)."""
        listed = ("token_logprobs",) if getattr(options, "token_logprobs", False) else ()
        return ("logprob", "tokens", "perplexity", "is_greedy", *listed)

    @classmethod
    def check_files(cls, path: Path, options: Any, *, allow_pickle: bool) -> None:
        super().check_files(path, options, allow_pickle=allow_pickle)
        if path.is_dir():
            check_causal(path, trust_remote_code=False)

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: LoglikConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.set_up(path, model=model, options=options, inp=inp)
        module = load_pretrained(AutoModelForCausalLM, path, model, executor, complete=True)
        encoder = self.encoding.encoder
        self.likelihood = Likelihood(
            executor.prepare(module), tensor=executor.tensor, collate=encoder.collate
        )
        mode = ("is_greedy",) if self.encoding.pair else ("perplexity",)
        listed = ("token_logprobs",) if options.token_logprobs else ()
        self.columns = fields(("logprob", "tokens", *mode, *listed), TYPES)
        self.listed = bool(listed)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """[units, HEAD (+ window)] float64 on the host (see the module's docstring)."""
        ids = [encoded.ids[i] for i in batch]
        targets = encoded.extra["targets"][batch]
        contexts = encoded.extra.get("contexts")
        picked, greedy = self.likelihood.score(
            ids, targets, None if contexts is None else contexts[batch]
        )
        starts = np.cumsum(targets) - targets
        out = np.zeros((len(batch), self.encoding.width), dtype=np.float64)
        out[:, 0] = np.add.reduceat(picked, starts) if len(picked) else 0.0
        out[:, 1] = np.logical_and.reduceat(greedy, starts) if len(greedy) else True
        out[:, 2] = targets
        if self.listed:
            columns = HEAD + np.concatenate([np.arange(t) for t in targets])
            out[np.repeat(np.arange(len(batch)), targets), columns] = picked
        return out

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        rows, owners = len(encoded.rows), encoded.owners
        total = np.bincount(owners, weights=results[:, 0], minlength=rows)
        tokens = np.bincount(owners, weights=results[:, 2], minlength=rows).astype(np.int64)
        columns = {
            "logprob": pa.array(total, type=pa.float64()),
            "tokens": pa.array(tokens.astype(np.int32), type=pa.int32()),
        }
        if self.encoding.pair:  # one unit per row
            greedy = np.ones(rows, dtype=bool)
            greedy[owners] = results[:, 1] > 0.5
            columns["is_greedy"] = pa.array(greedy, type=pa.bool_())
        else:
            columns["perplexity"] = pa.array(np.exp(-total / np.maximum(tokens, 1)), pa.float64())
        if self.listed:
            counts = results[:, 2].astype(np.int64)
            keep = np.arange(results.shape[1] - HEAD) < counts[:, None]
            order = np.argsort(owners, kind="stable")  # a row's windows, in order
            values = results[order, HEAD:][keep[order]]
            offsets = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int32)
            columns["token_logprobs"] = pa.ListArray.from_arrays(
                pa.array(offsets, pa.int32()), pa.array(values, pa.float64())
            )
        return columns

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.logprobs(reference, candidate, gate)
