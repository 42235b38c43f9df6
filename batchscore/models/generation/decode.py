"""How tokens are chosen: the job's decoding settings over the model's own generation config.

The job decides the strategy and the length (greedy unless it asks for beams or sampling), and
may set a repetition penalty; the model's ``generation_config.json`` still supplies its
constraints (EOS ids, forced BOS/EOS, banned n-grams, a beam length penalty, its own repetition
penalty where the job sets none). Sampling is done by `RowSampler`, which draws every row's tokens
from that row's own random stream, seeded by the job's seed and the row's prompt, so a sampled
output does not depend on which rows share its batch, window, chunk or run. `Picker` chooses tokens
the same way for the continuous scheduler (`schedule.py`), which runs its own loop, the
repetition penalty included. Stop strings are `stops.py`'s.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Decoding:
    """What the job asks of the decoder; see `GenerateConfig` for each key."""

    max_new_tokens: int
    num_beams: int = 1
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    repetition_penalty: float | None = None  # None: the model's own, if it sets one
    stop: tuple[str, ...] = ()

    @classmethod
    def of(cls, options: Any) -> Decoding:
        """The decoding keys of a `[generate]` or `[summarize]` section (others take defaults)."""
        keys = cls.__dataclass_fields__
        return cls(**{k: getattr(options, k) for k in keys if hasattr(options, k)})


def generation_config(base: Any, decoding: Decoding, pad_id: int) -> Any:
    """A copy of the model's GenerationConfig with the job's strategy and length in force.

    Sampling runs as greedy search over `RowSampler`'s one-hot scores, so transformers' own
    sampler (one random stream for the whole batch) is never used. Stop strings are left out:
    `stops.py` matches them (the model's own with the job's, `stop_strings`).
    """
    config = copy.deepcopy(base)
    if decoding.repetition_penalty is not None:
        config.repetition_penalty = decoding.repetition_penalty
    config.update(
        max_new_tokens=decoding.max_new_tokens,
        max_length=None,
        num_beams=decoding.num_beams,
        num_return_sequences=1,
        do_sample=False,
        temperature=None,
        top_k=None,
        top_p=None,
        pad_token_id=pad_id,
        use_cache=True,
        stop_strings=None,
    )
    return config


def stop_strings(base: Any, decoding: Decoding) -> tuple[str, ...]:
    """The strings that end a row: the job's, then any the model's generation config names."""
    own = getattr(base, "stop_strings", None)
    own = [own] if isinstance(own, str) else list(own or [])
    return tuple(dict.fromkeys([*decoding.stop, *own]))


# Generation-config keys that change nothing `Picker` and the scheduler's loop do differently from
# `generate` with `generation_config`: token ids, the strategy and length set above, sampling
# warpers `generate` never applies (`RowSampler` samples), the repetition penalty (`Picker`
# applies it), beam-only knobs, cache and output options, metadata. Any other key (banned
# n-grams, forced tokens, ...) makes `generate` add a step of its own, so such a model decodes
# statically. (Stop strings are matched apart from `generate`: `generation_config` clears them.)
LOOP_KEYS = frozenset(
    {
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "max_new_tokens",
        "max_length",
        "do_sample",
        "num_beams",
        "num_return_sequences",
        "use_cache",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
        "min_p",
        "top_h",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "early_stopping",
        "length_penalty",
        "num_beam_groups",
        "diversity_penalty",
        "low_memory",
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "compile_config",
        "disable_compile",
        "continuous_batching_config",
        "_from_model_config",
        "transformers_version",
    }
)


def loop_decodes_alike(config: Any) -> bool:
    """Whether the scheduler's own loop chooses the tokens `generate` would with ``config``
    (a `generation_config` result): greedy or `RowSampler` sampling, and nothing else."""
    return config.num_beams == 1 and set(config.to_diff_dict()) <= LOOP_KEYS


def eos_ids(config: Any) -> set[int]:
    """The token ids that end a sequence, from a GenerationConfig (an int, a list, or none)."""
    eos = config.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def row_seed(seed: int, prompt: np.ndarray) -> np.random.Generator:
    """A random stream for one row: a function of the job's seed and the row's prompt tokens."""
    digest = hashlib.blake2b(prompt.astype(np.int64).tobytes(), digest_size=16).digest()
    return np.random.default_rng([seed, int.from_bytes(digest, "little")])


def warpers(decoding: Decoding) -> Any:
    """Temperature, top-k and top-p, as the job sets them (a `LogitsProcessorList`)."""
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    steps = LogitsProcessorList()
    if decoding.temperature != 1.0:
        steps.append(TemperatureLogitsWarper(decoding.temperature))
    if decoding.top_k:
        steps.append(TopKLogitsWarper(decoding.top_k))
    if decoding.top_p < 1.0:
        steps.append(TopPLogitsWarper(decoding.top_p))
    return steps


def draw(steps: Any, scores: torch.Tensor, streams: list[np.random.Generator]) -> torch.Tensor:
    """One token per row (a column of ids): the warped distribution inverted at one uniform
    number from each row's own stream."""
    scores = steps(None, scores.float())  # the warpers read scores only, never the ids
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    draws = np.array([s.random() for s in streams], dtype=np.float32)
    uniform = torch.from_numpy(draws).to(cdf.device).unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, uniform, right=True).clamp(max=cdf.shape[1] - 1)


class Finite:
    """`finite` as a logits processor, for `generate`'s own loop (the static batches): first in
    the list, so the sampler after it never sees a NaN."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return finite(scores)


class RowSampler:
    """A logits processor that samples each row's next token from its own random stream.

    It applies temperature, top-k and top-p, draws one uniform number per row per step, inverts
    the row's cumulative distribution at it, and returns scores that are 0 at the drawn token and
    -inf elsewhere, so greedy search picks exactly that token.
    """

    def __init__(self, decoding: Decoding, prompts: list[np.ndarray]) -> None:
        self.streams = [row_seed(decoding.seed, p) for p in prompts]
        self.warpers = warpers(decoding)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens = draw(self.warpers, scores, self.streams)
        onehot = torch.full_like(scores, float("-inf"), dtype=torch.float32)
        return onehot.scatter_(1, tokens, 0.0)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` over float32 logits (rows x
    vocabulary): where ``seen`` (rows x at least vocabulary) marks a token the row holds, a
    positive logit is divided by ``penalty`` and a negative one multiplied, as it computes them."""
    scores = logits.float()
    hit = seen[:, : scores.shape[1]]
    return torch.where(hit, torch.where(scores < 0, scores * penalty, scores / penalty), scores)


class Picker:
    """Chooses each row's next token from its logits as `generate` does with `RowSampler`:
    the repetition ``penalty`` first (over the tokens each row has seen), then the argmax when
    greedy, else a draw from the row's own stream (`stream`)."""

    def __init__(
        self, decoding: Decoding, penalty: float | None = None, *, guard: bool = False
    ) -> None:
        """``guard``: the model runs in fp16, whose logits can overflow (see `finite`); chosen
        once, at load, so fp32 and bf16 pay nothing for it."""
        self.guard = guard
        self.seed = decoding.seed
        self.warpers = warpers(decoding) if decoding.do_sample else None
        self.penalty = penalty if penalty is not None and penalty != 1.0 else None

    @property
    def penalizes(self) -> bool:
        """Whether `__call__` needs each row's seen tokens."""
        return self.penalty is not None

    def stream(self, prompt: np.ndarray) -> np.random.Generator | None:
        """A row's random stream, started from its prompt; None when decoding is greedy."""
        return None if self.warpers is None else row_seed(self.seed, prompt)

    def __call__(
        self, logits: torch.Tensor, streams: list[Any], seen: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next token of each row of ``logits`` (rows x vocabulary); ``seen`` marks the
        tokens each row holds, prompt included, when `penalizes`."""
        if self.guard:
            logits = finite(logits)
        if self.penalty is not None:
            if seen is None:
                raise ValueError("a repetition penalty needs the tokens each row has seen")
            logits = penalize(logits, seen, self.penalty)
        if self.warpers is None:
            return logits.argmax(dim=-1)
        return draw(self.warpers, logits, streams)[:, 0]


def finite(logits: torch.Tensor) -> torch.Tensor:
    """fp16 logits in float32, NaN as -inf and +inf as the largest float32: torch's argmax takes
    a NaN for the maximum, so one NaN would pick its index as the token, and a softmax over an
    inf is NaN everywhere. Every row still gets a token (an overflowed maximum is still the
    maximum): none is dropped, none is garbage."""
    wide = logits.float()
    return torch.nan_to_num(wide, nan=float("-inf"), posinf=torch.finfo(torch.float32).max)


def trim(new_tokens: np.ndarray, eos: set[int]) -> np.ndarray:
    """Each row's generated tokens up to and including its first EOS (an object array of arrays)."""
    out = np.empty(len(new_tokens), dtype=object)
    is_eos = np.isin(new_tokens, list(eos)) if eos else np.zeros(new_tokens.shape, bool)
    for i, row in enumerate(new_tokens):
        hits = np.flatnonzero(is_eos[i])
        out[i] = row[: hits[0] + 1] if hits.size else row
    return out
