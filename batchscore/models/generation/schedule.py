"""Continuous batching for decoder-only generation: rows that finish leave the batch, and waiting
rows take their seats.

A static batch runs until its longest row ends and keeps computing the rows that ended before;
here each decode step computes only rows still generating, so a batch of answers from a few
tokens to `max_new_tokens` long costs about their total length, not rows x the longest. Rows
wait in the order they are given (the sampler's, by prompt length, so rows seated together are
alike in length and their cache pads little) and take seats while the seats fit the budget the
sampler cuts static batches by: seats x (longest prompt + max_new_tokens) <= max_tokens, and at
most max_rows seats. Waiting rows are prefilled together once `REFILL` of the seats are free,
since one call for several prompts costs little more than for one, then join the running batch.

The start that the prompts share (a job's prompt template, a chat template's system turn) is
computed once (`Prefixes`) and each prefill reads its cache instead of computing it again.
Tokens are chosen by `Picker` as `generate` chooses them (its repetition penalty included), and
a row ends at EOS, at max_new_tokens or at a stop string (`Stops`, transformers' own matching),
so a row's tokens are those it gets alone. Under structured generation each row brings its own
grammar matcher (`Constraint`), which masks that row's logits before its token is chosen.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from batchscore.models.generation.constraint import Constraint
from batchscore.models.generation.decode import Picker
from batchscore.models.generation.seats import Forward, Prefix, Seats
from batchscore.models.generation.stops import Stops

# Share of the seats that must be free before waiting rows are prefilled to take them: lower
# refills more often in smaller calls, higher leaves seats empty longer. scripts/generate_bench.py
# measured 1/8 to 1/2 within a few percent of each other on the toy decoder; 1/4 was best.
REFILL = 0.25

R = TypeVar("R")
Finishing = Generator[tuple[int, np.ndarray], None, R]  # yields finished rows, returns R


def shared_start(prompts: list[np.ndarray], cut: int) -> np.ndarray:
    """The longest run of tokens that starts every prompt shorter than ``cut`` (a prompt cut at
    ``cut`` tokens lost its start, as a decoder's prompt keeps its end: it is prefilled whole)."""
    whole = [p for p in prompts if len(p) < cut] or prompts
    if not whole:
        return np.empty(0, dtype=np.int64)
    first = whole[0]
    n = min(len(p) for p in whole)
    for prompt in whole[1:]:
        differ = np.flatnonzero(prompt[:n] != first[:n])
        n = int(differ[0]) if differ.size else n
        if n == 0:
            break
    return first[:n]


class Prefixes:
    """The shared start's cache, kept from one window to the next: computed again only when a
    window's prompts do not all start with the one already computed."""

    def __init__(self) -> None:
        self.last: Prefix | None = None

    def get(self, forward: Forward, tokens: np.ndarray) -> Prefix:
        last = self.last
        if last is None or not (
            len(last.tokens) <= len(tokens)
            and np.array_equal(tokens[: len(last.tokens)], last.tokens)
        ):
            self.last = Prefix.compute(forward, tokens)
        return self.last


@dataclass
class Row:
    """A seated row: its place in the queue, the tokens it generated, its random stream, and
    the end of its prompt that a stop string may begin in."""

    index: int
    size: int  # prompt + max_new_tokens: what the budget counts for it
    stream: Any
    context: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    matcher: Any = None  # its grammar's matcher, under structured generation


Joined = tuple[Seats, list[Row]]  # newly prefilled rows still generating, and their seats


@dataclass
class Limits:
    """When a row is done, and how many rows may sit together."""

    eos: set[int]
    max_new_tokens: int
    max_tokens: int
    max_rows: int
    stops: Stops | None = None


class Schedule:
    """Generates for ``prompts`` with continuous batching; iterating yields (prompt index, new
    token ids up to and including EOS) as each row finishes.

    ``prefills`` lists the prompt indices prefilled in each call, ``reused`` counts the prompt
    tokens read from the shared prefix's cache instead of computed.
    """

    def __init__(
        self,
        forward: Forward,
        prompts: list[np.ndarray],
        *,
        picker: Picker,
        limits: Limits,
        prefixes: Prefixes | None,
        cut: int,
        constraint: Constraint | None = None,
    ) -> None:
        self.forward, self.prompts, self.picker, self.limits = forward, prompts, picker, limits
        self.prefixes, self.cut, self.constraint = prefixes, cut, constraint
        self.sizes = [len(p) + limits.max_new_tokens for p in prompts]
        self.prefills: list[np.ndarray] = []
        self.reused = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        prefix = self.shared_prefix()
        seats: Seats | None = None
        seated: list[Row] = []
        queue = 0
        while queue < len(self.prompts) or seated:
            joining = self.to_seat(seated, queue)
            if joining:
                group = list(range(queue, queue + joining))
                queue += joining
                joined = yield from self.prefill(group, prefix)
                if joined is not None:
                    if seats is None:
                        seats = joined[0]
                    else:
                        seats.join(joined[0])
                    seated += joined[1]
            if not seated:
                continue
            tokens = torch.tensor([row.tokens[-1] for row in seated], device=seats.mask.device)
            logits = seats.step(self.forward, tokens)
            alive = yield from self.advance(seated, logits, seats.seen)
            if len(alive) < len(seated):
                seated = [seated[i] for i in alive]
                if seated:
                    seats.keep(torch.tensor(alive, device=seats.mask.device))
                else:
                    seats = None

    def shared_prefix(self) -> Prefix | None:
        """The shared start's cache, when there is a start that two or more prompts go past."""
        if self.prefixes is None:
            return None
        tokens = shared_start(self.prompts, self.cut)
        if not len(tokens) or sum(len(p) > len(tokens) for p in self.prompts) < 2:
            return None
        return self.prefixes.get(self.forward, tokens)

    def to_seat(self, seated: list[Row], queue: int) -> int:
        """How many waiting rows to seat now: as many as fit, once `REFILL` of the seats are
        free; a row too long for the budget still runs, alone."""
        widest, count, fits = max((r.size for r in seated), default=0), len(seated), 0
        while queue + fits < len(self.prompts):
            wider = max(widest, self.sizes[queue + fits])
            rows = count + fits + 1
            if rows > self.limits.max_rows or rows * wider > self.limits.max_tokens:
                break
            widest, fits = wider, fits + 1
        if not count:
            return max(fits, 1) if queue < len(self.prompts) else 0
        return fits if fits >= REFILL * (count + fits) else 0

    def prefill(self, group: list[int], prefix: Prefix | None) -> Finishing[Joined | None]:
        """Prefill ``group``: the prompts that start with the shared prefix in one call that
        reads its cache, the others (cut at the front, or no prefix) in another; returns the
        seats of rows not yet done and those rows, or None when all are."""
        served = [i for i in group if prefix is not None and prefix.serves(self.prompts[i])]
        others = [i for i in group if i not in set(served)]
        joined: Joined | None = None
        for part, use in ((served, prefix), (others, None)):
            got = (yield from self.prefill_part(part, use)) if part else None
            if got is not None and joined is not None:
                joined[0].join(got[0])
                joined = (joined[0], joined[1] + got[1])
            elif got is not None:
                joined = got
        return joined

    def prefill_part(self, group: list[int], use: Prefix | None) -> Finishing[Joined | None]:
        """Prefill ``group``'s prompts in one call (after ``use``, a prefix all of them start
        with) and pick each row's first token, as `prefill` returns."""
        prompts = [self.prompts[i] for i in group]
        seats, logits = Seats.prefill(self.forward, prompts, use, track=self.picker.penalizes)
        self.prefills.append(np.asarray(group, dtype=np.int64))
        self.reused += len(use.tokens) * len(group) if use is not None else 0
        stops = self.limits.stops
        rows = [
            Row(
                i,
                self.sizes[i],
                self.picker.stream(self.prompts[i]),
                self.prompts[i][-stops.window :].tolist() if stops else [],
                matcher=self.constraint.matcher() if self.constraint else None,
            )
            for i in group
        ]
        alive = yield from self.advance(rows, logits, seats.seen)
        if not alive:
            return None
        if len(alive) < len(rows):
            seats.keep(torch.tensor(alive, device=seats.mask.device))
        return seats, [rows[i] for i in alive]

    def advance(
        self, rows: list[Row], logits: torch.Tensor, seen: torch.Tensor | None
    ) -> Finishing[list[int]]:
        """Give each row its next token (``seen``: the tokens each holds, for the repetition
        penalty); yields the rows that are done, returns the others' positions in ``rows``.
        Under a grammar, each row's own matcher masks its logits first and follows its token."""
        matchers = [row.matcher for row in rows] if self.constraint is not None else None
        if matchers is not None:  # host work from tokens already here: overlaps a GPU forward
            logits = self.constraint.mask(logits, matchers)
        picked = self.picker(logits, [row.stream for row in rows], seen).tolist()
        if matchers is not None:
            Constraint.feed(matchers, picked)
        for row, token in zip(rows, picked, strict=True):
            row.tokens.append(token)
        stops = self.limits.stops
        stopped = None
        if stops is not None:  # each row's last tokens, as many as a match looks back over
            stopped = stops.hits([row.context + row.tokens[-stops.window :] for row in rows])
        alive = []
        for i, row in enumerate(rows):
            ended = row.tokens[-1] in self.limits.eos or (stopped is not None and stopped[i])
            if ended or len(row.tokens) >= self.limits.max_new_tokens:
                yield row.index, np.asarray(row.tokens, dtype=np.int64)
            else:
                alive.append(i)
        return alive
