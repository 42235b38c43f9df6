"""The running batch of continuous generation: each seated row's KV cache, attention mask and
next position, kept in one `transformers` `DynamicCache`, and (for a repetition penalty) the
tokens each row holds.

Rows are right-aligned: every row's newest token sits in the last column, so one decode step
feeds each seat one token and appends one column. A row's history may hold padding anywhere
(before its prompt, or between a shared prefix and the rest of the prompt): the attention mask
hides it, and positions are counted per row, so where padding sits never changes what a row
computes. Rows leave (`Seats.keep`) and join (`Seats.join`) by copying the cache once; columns
that no remaining row uses are dropped when rows join.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def plain_cache(model: Any) -> bool:
    """Whether every layer of ``model`` keeps a plain, growing KV cache (no sliding window, no
    recurrent state), the only kind whose rows the scheduler may move about."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a config transformers cannot read layer types from: not plain
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class Forward:
    """Calls a decoder over a KV cache, with the keywords its `transformers` version takes."""

    def __init__(self, model: Any) -> None:
        params = inspect.signature(model.forward).parameters
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.cache_keyword = "cache" if "cache" in params else "past_key_values"  # renamed in 5.x
        # A prefill needs the logits of its last column only, and the output layer over a whole
        # prompt is the largest matrix product of the call: skip the rest where the model can.
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """The next-token logits of each row's last column; ``cache`` grows by the columns fed."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_keyword: cache},
            **self.last_only,
        )
        return out.logits[:, -1]


@dataclass
class Prefix:
    """The KV cache of the prompt start that a job's rows share, computed once (batch of one)."""

    tokens: np.ndarray
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def compute(cls, forward: Forward, tokens: np.ndarray) -> Prefix:
        from transformers import DynamicCache

        ids = torch.from_numpy(tokens).to(forward.device).unsqueeze(0)
        positions = torch.arange(len(tokens), device=forward.device).unsqueeze(0)
        cache = DynamicCache(config=forward.config)
        forward(ids, torch.ones_like(ids), positions, cache)
        return cls(tokens, [(k, v) for k, v, *_ in cache])

    def serves(self, prompt: np.ndarray) -> bool:
        """Whether ``prompt`` starts with the prefix and goes on past it (its last token must be
        computed to give the logits of its first new token)."""
        n = len(self.tokens)
        return len(prompt) > n and bool(np.array_equal(prompt[:n], self.tokens))


@dataclass
class Seats:
    """Seated rows: their cache (rows x heads x width x dim per layer), ``mask`` (rows x width,
    1 where a column holds the row's token), each row's next position id and, when tracked,
    ``seen`` (rows x vocabulary + 1, true where the row holds that token: prompt and fed)."""

    cache: Any  # a transformers DynamicCache
    mask: torch.Tensor
    positions: torch.Tensor
    seen: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @classmethod
    def prefill(
        cls,
        forward: Forward,
        prompts: list[np.ndarray],
        prefix: Prefix | None = None,
        *,
        track: bool = False,
    ) -> tuple[Seats, torch.Tensor]:
        """Run new rows' prompts (after ``prefix``, whose cache they read) in one left-padded
        call; returns their seats and the logits of each row's first new token. ``track``
        keeps the tokens each row holds (`seen`)."""
        from transformers import DynamicCache

        device = forward.device
        start = len(prefix.tokens) if prefix else 0
        rest = [p[start:] for p in prompts]
        lengths = np.fromiter(map(len, rest), dtype=np.int64, count=len(rest))
        width = int(lengths.max())
        real = np.arange(width) >= (width - lengths)[:, None]  # left padding
        ids = np.zeros((len(rest), width), dtype=np.int64)
        ids[real] = np.concatenate(rest)
        real_t = torch.from_numpy(real).to(device)
        positions = (real_t.long().cumsum(1) - 1 + start).masked_fill(~real_t, 1)
        mask = real_t.long()
        if prefix:
            n = len(prompts)
            cache = DynamicCache(
                ddp_cache_data=[
                    (k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in prefix.kv
                ]
            )
            mask = torch.cat([torch.ones(n, start, dtype=torch.long, device=device), mask], dim=1)
        else:
            cache = DynamicCache(config=forward.config)
        logits = forward(torch.from_numpy(ids).to(device), mask, positions, cache)
        seats = cls(cache, mask, torch.from_numpy(lengths + start).to(device))
        if track:
            seats.seen = holding(prompts, logits.shape[-1], device)
        return seats, logits

    def step(self, forward: Forward, tokens: torch.Tensor) -> torch.Tensor:
        """Feed every seat its next token; returns each seat's logits for the token after it."""
        ones = torch.ones(self.rows, 1, dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        logits = forward(tokens.unsqueeze(1), self.mask, self.positions.unsqueeze(1), self.cache)
        self.positions = self.positions + 1
        if self.seen is not None:
            last = self.seen.shape[1] - 1  # ids past the vocabulary: a column nobody reads
            self.seen.scatter_(1, tokens.clamp(max=last).unsqueeze(1), True)
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` stay seated (the others finished)."""
        self.cache.batch_select_indices(rows)
        self.mask, self.positions = self.mask[rows], self.positions[rows]
        if self.seen is not None:
            self.seen = self.seen[rows]

    def join(self, other: Seats) -> None:
        """Seat ``other``'s rows after these, right-aligned, dropping columns no row uses."""
        from transformers import DynamicCache

        width = max(self.mask.shape[1], other.mask.shape[1])
        mask = torch.cat([pad_left(self.mask, width), pad_left(other.mask, width)])
        used = mask.bool().any(dim=0)
        layers = []
        for (k1, v1, *_), (k2, v2, *_) in zip(self.cache, other.cache, strict=True):
            keys = torch.cat([pad_left(k1, width), pad_left(k2, width)])[:, :, used]
            values = torch.cat([pad_left(v1, width), pad_left(v2, width)])[:, :, used]
            layers.append((keys, values))
        self.cache = DynamicCache(ddp_cache_data=layers)
        self.mask = mask[:, used]
        self.positions = torch.cat([self.positions, other.positions])
        if self.seen is not None and other.seen is not None:
            self.seen = torch.cat([self.seen, other.seen])


def holding(prompts: list[np.ndarray], vocab: int, device: torch.device) -> torch.Tensor:
    """Rows x (vocab + 1) booleans, true where a prompt holds the token (ids past the vocabulary,
    which the model cannot produce, land in the last column, as transformers drops them)."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), vocab, dtype=np.int64)
    for i, prompt in enumerate(prompts):
        ids[i, : len(prompt)] = np.minimum(prompt, vocab)
    seen = torch.zeros(len(prompts), vocab + 1, dtype=torch.bool, device=device)
    return seen.scatter_(1, torch.from_numpy(ids).to(device), True)


def pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` with zero columns added on the left of its sequence dimension, up to ``width``
    (a mask: dimension 1 of 2; keys and values: dimension 2 of 4)."""
    dim = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
