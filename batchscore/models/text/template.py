"""Where a tokenizer puts its special tokens around one text or a pair, learnt by probing it.

Windows of a long text are cut from its token ids without special tokens, then each is wrapped
the way the tokenizer wraps a whole input (``[CLS] ... [SEP]``, ``<s> ... </s></s> ... </s>``),
with the token type ids it gives each part. Probing the tokenizer's own post-processor once
keeps this right for any template, without a table of model families.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from batchscore.errors import ModelError

PROBES = ("a", "b")


def find(part: list[int], ids: list[int], start: int = 0) -> int:
    """Where ``part`` first occurs in ``ids`` at or after ``start``; -1 when it does not."""
    for i in range(start, len(ids) - len(part) + 1):
        if ids[i : i + len(part)] == part:
            return i
    return -1


@dataclass(frozen=True)
class Template:
    """The special tokens (and type ids) around the first text, between the two, and after."""

    ids: tuple[list[int], list[int], list[int]]  # before, between (pairs only), after
    types: tuple[list[int], list[int], list[int]]
    first_type: int = 0
    second_type: int = 0

    @property
    def specials(self) -> int:
        """Special tokens the template adds."""
        return sum(map(len, self.ids))

    def wrap(self, first: np.ndarray, second: np.ndarray | None = None) -> np.ndarray:
        """The model's input ids for content ids (one text, or a pair)."""
        before, between, after = (np.asarray(p, dtype=np.int64) for p in self.ids)
        if second is None:
            return np.concatenate([before, first, after])
        return np.concatenate([before, first, between, second, after])

    def wrap_types(self, first: int, second: int) -> np.ndarray:
        """Token type ids for a pair of ``first`` and ``second`` content tokens."""
        before, between, after = self.types
        parts = [before, [self.first_type] * first, between, [self.second_type] * second, after]
        return np.asarray([t for part in parts for t in part], dtype=np.int64)


def learn(tokenizer: Any, pair: bool, source: object) -> Template:
    """Probe ``tokenizer`` (a `tokenizers.Tokenizer`) for its single-text or pair template."""
    a, b = (tokenizer.encode(p, add_special_tokens=False) for p in PROBES)
    full = tokenizer.post_process(a, b if pair else None)
    ids, types = full.ids, full.type_ids
    i = find(a.ids, ids)
    j = find(b.ids, ids, i + len(a.ids)) if pair else i + len(a.ids)
    if i < 0 or j < 0 or (pair and find(b.ids, ids, j + 1) >= 0):
        raise ModelError(
            f"{source}: cannot tell where this tokenizer puts its special tokens, so long texts "
            'cannot be windowed; use [model].long_text = "truncate"'
        )
    end = j + len(b.ids) if pair else j
    return Template(
        ids=(ids[:i], ids[i + len(a.ids) : j] if pair else [], ids[end:]),
        types=(types[:i], types[i + len(a.ids) : j] if pair else [], types[end:]),
        first_type=types[i],
        second_type=types[j] if pair else 0,
    )
