"""Structured generation while decoding: each row's own grammar matcher masks its next token.

A row's matcher follows the tokens the row has generated and says which tokens may come next;
every other logit is set to -inf before the token is chosen (greedy, sampled, after the
repetition penalty: -inf stays -inf), so whatever the model's weights, a row writes only text
its grammar allows, and once the value is complete only an EOS. Matchers belong to rows, not
to batches: in continuous batching a seat that finishes takes its matcher with it and a row
that joins brings a new one, and the masks of all seated rows are filled in one call that
llguidance spreads over its own threads outside the GIL. The masks are computed on the host
from tokens already there, after the step's forward was launched, so on a GPU they overlap it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from batchscore.errors import ModelError
from batchscore.models.generation.structure import engine

BITS = torch.arange(32, dtype=torch.int32)


class Constraint:
    """A grammar over a model's tokenizer: new matchers for rows, their masks on logits."""

    def __init__(self, grammar: str, tokenizer: Any, *, vocab: int, eos: set[int]) -> None:
        """``grammar``: `Structure.grammar`; ``tokenizer``: the model folder's (a transformers
        fast tokenizer); ``vocab``: the width of the model's logits, which may pass the
        tokenizer's length (ids past it are never allowed); ``eos``: the ids that end a row."""
        self.llguidance = engine()
        from llguidance.hf import from_tokenizer

        named = sorted(eos) or None  # none named: the tokenizer's own
        try:
            self.tokenizer = from_tokenizer(tokenizer, n_vocab=vocab, eos_token=named)
        except (ValueError, TypeError) as exc:  # a vocabulary it cannot spell (WordPiece)
            raise ModelError(
                f"[generate]: structured generation cannot read this model's tokenizer: {exc}"
            ) from exc
        self.grammar = grammar
        self.vocab = vocab
        self.words = (vocab + 31) // 32
        self.executor = self.llguidance.LLExecutor()
        # the mask of a row whose value is complete: its EOS ids alone
        ends = np.zeros(self.words * 32, dtype=bool)
        ends[[e for e in eos if e < vocab] or [self.tokenizer.eos_token]] = True
        self.ends = torch.from_numpy(np.packbits(ends, bitorder="little").view(np.int32).copy())

    def matcher(self) -> Any:
        """A new row's matcher, at the start of its value."""
        return self.llguidance.LLMatcher(self.tokenizer, self.grammar)

    def mask(self, logits: torch.Tensor, matchers: list[Any]) -> torch.Tensor:
        """``logits`` (rows x vocabulary, one row per matcher) with each row's disallowed tokens
        at -inf. A matcher that has stopped (its value complete: the grammar allows nothing
        more) allows only EOS, which ends the row (and is what `generate` pads a row with
        after it ends)."""
        bitmask = torch.zeros((len(matchers), self.words), dtype=torch.int32)
        live = [(m, i) for i, m in enumerate(matchers) if not m.is_stopped()]
        if live:
            self.executor.unsafe_compute_mask_ptr(
                live, bitmask.data_ptr(), self.words * 4, len(matchers)
            )
        if len(live) < len(matchers):
            stopped = [i for i, m in enumerate(matchers) if m.is_stopped()]
            bitmask[stopped] = self.ends
        width = logits.shape[1]
        if logits.device.type == "cpu":  # numpy's where: several times torch's masked_fill here
            allowed = unpack_host(bitmask, width)
            scores = logits.float().numpy()
            return torch.from_numpy(np.where(allowed, scores, np.float32(-np.inf)))
        allowed = unpack_device(bitmask.to(logits.device, non_blocking=True), width)
        return logits.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def feed(matchers: list[Any], tokens: list[int]) -> None:
        """Each row's matcher follows the token the row was given."""
        for matcher, token in zip(matchers, tokens, strict=True):
            if not matcher.is_stopped():
                matcher.consume_token(token)

    def complete(self, tokens: np.ndarray, eos: set[int]) -> bool:
        """Whether ``tokens`` (a row's new tokens, an EOS at the end or not) spell a whole
        value: one the grammar accepts as it stands."""
        matcher = self.matcher()
        body = [int(t) for t in tokens if int(t) not in eos]
        return matcher.consume_tokens(body) and matcher.is_accepting()


def unpack_host(bitmask: torch.Tensor, width: int) -> np.ndarray:
    """The rows x ``width`` booleans of a packed bitmask (bit j of word i: token 32 i + j),
    unpacked by numpy (torch's shifts cost 50 times more on the host)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return bits[:, :width].view(np.bool_)


def unpack_device(words: torch.Tensor, width: int) -> torch.Tensor:
    """`unpack_host` on the packed words' device: for a GPU the words travel, 32 times smaller
    than the booleans, and the device unpacks them."""
    bits = (words.unsqueeze(-1) >> BITS.to(words.device)) & 1
    return bits.reshape(len(words), -1)[:, :width].bool()


class Masking:
    """A transformers logits processor that keeps one matcher per row of a `generate` call
    (the static batches): each call feeds every row's last token to its matcher, then masks."""

    def __init__(self, constraint: Constraint, rows: int) -> None:
        self.constraint = constraint
        self.matchers = [constraint.matcher() for _ in range(rows)]
        self.start: int | None = None  # the ids' width at the first call: the prompt's

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        elif input_ids.shape[1] > self.start:
            Constraint.feed(self.matchers, input_ids[:, -1].tolist())
        return self.constraint.mask(scores, self.matchers)
