"""Token log-probabilities of a causal language model over a batch of units, each unit its
token ids and how many of its last tokens are scored (its targets), each target predicted
from the tokens before it.

A target's log-probability is its logit's log-softmax over the vocabulary, in float32 whatever
the model's precision (as lm-evaluation-harness upcasts before its ``log_softmax``); it is
greedy when its logit is the largest (an argmax, ties to the first). Only the targets' rows
of the logits are upcast and normalized, never a whole batch's [rows, tokens, vocabulary].

Units that share a context (a multiple-choice item's options: the same context tokens, then
each option's) read it once where the model keeps a plain KV cache: the batch's distinct
contexts are computed together, left-padded, their cache copied to each unit that reads
them, and the continuations run after it, with their positions counted from each context's
end. A row's log-probabilities are those of its whole sequence computed alone (to float
noise: the tests hold them within 1e-5 of it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from batchscore.models.generation.seats import Forward, plain_cache


class Likelihood:
    """A loaded causal LM that scores batches of units. ``tensor`` moves a host array to the
    model's device (the executor's, which stages it as the device needs); ``collate`` pads a
    batch of token ids, right or left (the tokenizer's `TextEncoder.collate`)."""

    def __init__(self, model: Any, *, tensor: Callable, collate: Callable) -> None:
        self.model = model
        self.tensor = tensor
        self.collate = collate
        self.cache_keyword = Forward(model).cache_keyword
        self.shares = plain_cache(model)  # whether a context's cache may be copied to rows

    def score(
        self, ids: list[np.ndarray], targets: np.ndarray, contexts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each target's log-probability (float64) and whether it was greedy, in unit order,
        each unit's targets in token order. ``contexts``: each unit's context length, where
        its targets are every token after it (a context and a continuation)."""
        if contexts is not None and self.shares and shared(ids, contexts):
            logits, tokens = self.after_contexts(ids, contexts)
        else:
            logits, tokens = self.whole(ids, targets)
        logits = logits.float()
        chosen = self.tensor(tokens)
        picked = logits.gather(1, chosen[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        greedy = logits.argmax(dim=-1) == chosen
        # the device-to-host copy: a sync point on CUDA
        return picked.double().cpu().numpy(), greedy.cpu().numpy()

    def whole(self, ids: list[np.ndarray], targets: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Every unit read whole, right-padded: the logits rows that predict its targets."""
        input_ids, mask = self.collate(ids)
        out = self.model(input_ids=self.tensor(input_ids), attention_mask=self.tensor(mask))
        lengths = mask.sum(axis=1)
        rows = np.repeat(np.arange(len(ids)), targets)
        # unit i's targets are its last t tokens, each predicted by the position before it
        first = np.repeat(lengths - 1 - targets, targets)
        positions = first + ranks(targets)
        tokens = input_ids[rows, positions + 1]
        return out.logits[self.tensor(rows), self.tensor(positions)], tokens

    def after_contexts(
        self, ids: list[np.ndarray], contexts: np.ndarray
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Each distinct context once, its KV cache copied to the units that read it, then
        every continuation after its context's cache."""
        from transformers import DynamicCache

        keys = [ids[i][: contexts[i]].tobytes() for i in range(len(ids))]
        first: dict[bytes, int] = {}
        group = np.fromiter((first.setdefault(k, len(first)) for k in keys), np.int64, len(keys))
        firsts = np.unique(group, return_index=True)[1]  # each context's first unit
        heads = [ids[i][: contexts[i]] for i in firsts]
        head_ids, head_mask = self.collate(heads, left=True)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=self.tensor(head_ids),
            attention_mask=self.tensor(head_mask),
            position_ids=self.tensor(np.maximum(head_mask.cumsum(axis=1) - 1, 0)),
            use_cache=True,
            **{self.cache_keyword: cache},
        )
        last = out.logits[:, -1]  # each context's last position predicts its first target
        cache.reorder_cache(self.tensor(group))  # one copy of a context's cache per unit
        tails = [unit[start:] for unit, start in zip(ids, contexts, strict=True)]
        tail_ids, tail_mask = self.collate(tails)
        seen = head_mask[group].sum(axis=1)
        more = self.model(
            input_ids=self.tensor(tail_ids),
            attention_mask=self.tensor(np.concatenate([head_mask[group], tail_mask], axis=1)),
            position_ids=self.tensor(seen[:, None] + np.arange(tail_ids.shape[1])),
            use_cache=True,
            **{self.cache_keyword: cache},
        ).logits
        targets = tail_mask.sum(axis=1)
        rows = np.repeat(np.arange(len(ids)), targets - 1)
        positions = ranks(targets - 1)
        after = more[self.tensor(rows), self.tensor(positions)]
        logits = torch.cat([last[self.tensor(group)], after])
        # unit order: each unit's first target (from its context), then the rest (its tail's)
        order = np.empty(int(targets.sum()), dtype=np.int64)
        starts = np.cumsum(targets) - targets
        order[starts] = np.arange(len(ids))
        rest = np.ones(len(order), dtype=bool)
        rest[starts] = False
        order[rest] = len(ids) + np.arange(int(rest.sum()))
        tokens = np.concatenate(tails)
        return logits[self.tensor(order)], tokens


def ranks(counts: np.ndarray) -> np.ndarray:
    """0 .. n-1 for each n of ``counts``, concatenated."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


def shared(ids: list[np.ndarray], contexts: np.ndarray) -> bool:
    """Whether two units of the batch read the same context (worth computing it once)."""
    if not len(contexts) or contexts.min() < 1:
        return False
    keys = [ids[i][: contexts[i]].tobytes() for i in range(len(ids))]
    return len(set(keys)) < len(keys)
