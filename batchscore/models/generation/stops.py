"""Stop strings: where a row's generation ends, as transformers' ``StopStringCriteria`` decides.

A row stops at the first new token that completes one of the strings in its text, the prompt's
end included (a stop string may begin in the prompt), and the string may end inside that token.
transformers' criterion does the matching, over its own table of what each vocabulary entry
spells, so a row stops exactly where `generate` with ``stop_strings`` stops it, statically
batched or continuously. What is written is the text before the string.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from batchscore.errors import ModelError


class Stops:
    """The job's stop strings matched over token ids with a model folder's tokenizer."""

    def __init__(self, strings: tuple[str, ...], tokenizer: Any, source: object) -> None:
        from transformers import StopStringCriteria

        try:
            self.criterion = StopStringCriteria(tokenizer, list(strings))
        except ValueError as exc:  # a string no token of the vocabulary can spell
            raise ModelError(f"[generate].stop: {source}: {exc}") from exc
        self.strings = strings
        # the criterion reads at most this many of a sequence's last tokens: one per character
        self.window = int(self.criterion.maximum_token_len)
        # ids past the vocabulary read as the criterion's dummy entry, which matches nothing:
        # what fills a short sequence's window, and hides a batch's padding
        self.nothing = int(self.criterion.embedding_vec.shape[0])

    def hits(self, sequences: list[list[int]] | list[np.ndarray]) -> np.ndarray:
        """Whether each token sequence ends in a stop string (its last token completes one)."""
        windows = np.full((len(sequences), self.window), self.nothing, dtype=np.int64)
        for i, sequence in enumerate(sequences):
            tail = np.asarray(sequence[-self.window :], dtype=np.int64)
            windows[i, self.window - len(tail) :] = tail
        return self.criterion(torch.from_numpy(windows), None).numpy()

    def first(self, context: np.ndarray, tokens: np.ndarray) -> int | None:
        """How many of ``tokens`` (generated after ``context``) were made when a stop string
        was first completed; None when none was."""
        if not len(tokens):
            return None
        sequence = np.concatenate([np.asarray(context, np.int64), tokens])
        ends = range(len(context) + 1, len(sequence) + 1)
        hit = np.flatnonzero(self.hits([sequence[:end] for end in ends]))
        return int(hit[0]) + 1 if hit.size else None

    def cut(self, text: str, head: str = "") -> str:
        """``text`` before the first stop string in it; ``head`` is the text it follows (the
        prompt's end), where a stop string may begin. Unchanged when none is found."""
        full = head + text
        starts = []
        for string in self.strings:
            at = full.find(string, max(0, len(head) - len(string) + 1))
            if at >= 0:
                starts.append(at)
        return text[: max(0, min(starts) - len(head))] if starts else text

    def criteria(self, padding: np.ndarray) -> Any:
        """A stopping criterion for `generate` over rows left-padded by ``padding`` tokens:
        the padding is hidden from the match, so a row stops where it stops alone."""
        return PaddedStops(self, padding)


class PaddedStops:
    """`Stops` as a transformers stopping criterion for one batch (`Stops.criteria`)."""

    def __init__(self, stops: Stops, padding: np.ndarray) -> None:
        self.stops = stops
        self.padding = torch.from_numpy(np.asarray(padding, dtype=np.int64))

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        padding = self.padding.to(input_ids.device)
        if input_ids.shape[0] != len(padding):  # beams: each row's hypotheses side by side
            padding = padding.repeat_interleave(input_ids.shape[0] // len(padding))
        columns = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = input_ids.masked_fill(columns[None, :] < padding[:, None], self.stops.nothing)
        return self.stops.criterion(hidden, scores)
