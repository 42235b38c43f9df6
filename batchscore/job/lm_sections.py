"""The sections of the tasks that score text with a language model rather than encode or
generate it: `[loglik]` (a causal LM's log-likelihood of a text, or of a continuation given a
context) and `[reward]` (a reward model's score of a conversation).

Kept beside `batchscore.job.sections`, which registers them in `TASK_SECTIONS`, as frozen
dataclasses the schema builds like every other section. What a task asks of the other
sections is said in class attributes, as `sections`' own tasks say it; each names the one
value of `ModelNeeded` it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass(frozen=True)
class LoglikConfig:
    """[loglik]: the sum of a causal language model's token log-probabilities per row.

    Over `[input].text` alone, every token of the text is scored after the tokenizer's BOS
    token, as lm-evaluation-harness's rolling log-likelihood scores it; a text longer than
    the model's window is read in windows that advance by ``stride`` tokens (default: half the
    window), each token predicted once, from up to a window of the tokens before it (the
    strided perplexity of transformers' guide; docs/tasks.md has the formula). With
    `[input].text_pair`, the continuation (that column) is scored given the context (`text`),
    with `is_greedy`, as lm-evaluation-harness's ``loglikelihood`` requests are.
    ``token_logprobs`` adds each scored token's log-probability, in order, as a list.
    """

    # what the task asks of the other sections (class attributes, not job keys; job.parse checks)
    model_needed: ClassVar[Literal["own"]] = "own"
    reads_pairs: ClassVar[bool] = True
    windows: ClassVar[bool] = False  # it windows a long text itself, by `stride`

    stride: int | None = field(default=None, metadata={"min": 1})
    token_logprobs: bool = False


@dataclass(frozen=True)
class RewardConfig:
    """[reward]: a sequence-classification reward model's score of each row's conversation,
    put through the model's chat template as its card does: `[input].messages` (a list of
    {role, content}, or its JSON text), or `[input].text` and `text_pair` as one user and one
    assistant turn. No keys of its own: the model's labels decide its columns."""

    # what the task asks of the other sections (class attributes, not job keys; job.parse checks)
    model_needed: ClassVar[Literal["own"]] = "own"
    reads_pairs: ClassVar[bool] = True
    windows: ClassVar[bool] = False
