"""Long texts whole (`[model].long_text = "chunk"`): token windows, and their results met again.

A text longer than the model's window is cut into windows of the window's size (special tokens
included), each starting with the last eighth of the one before (`overlap`), so no token is
read without some context on its left, for about 14% more tokens than the text holds. Each
window is one unit for the sampler: a long text becomes many full-length units, which pad
perfectly next to each other. Pure functions over token ids and arrays.
"""

from __future__ import annotations

import numpy as np

OVERLAP = 8  # windows share 1/OVERLAP of the model's window with the window before


def overlap(max_length: int) -> int:
    """Tokens a window repeats from the one before it, for a model window of ``max_length``."""
    return max_length // OVERLAP


def cut(content: np.ndarray, *, size: int, overlap: int, head: int = 0) -> list[np.ndarray]:
    """``content`` (token ids without special tokens) as windows of at most ``size`` tokens.

    The first ``head`` tokens (a prompt) lead every window; the rest is cut into pieces that
    each repeat the last ``overlap`` tokens of the piece before. Content that fits is one
    window, itself. Every token is in some window, in order.
    """
    if len(content) <= size:
        return [content]
    lead, body = content[:head], content[head:]
    room = size - head
    if room <= overlap:
        raise ValueError(f"a window of {size} tokens cannot hold a {head}-token prompt")
    step, starts = room - overlap, [0]
    while starts[-1] + room < len(body):
        starts.append(starts[-1] + step)
    return [np.concatenate([lead, body[s : s + room]]) for s in starts]


def mean_by_owner(
    values: np.ndarray, owners: np.ndarray, count: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Per owner (0 .. count-1), the mean of its units' rows in ``values``, weighted if given.

    An owner with one unit gets that unit's row unchanged (bit for bit), so texts that fit one
    window come out exactly as they would without windows.
    """
    units = np.bincount(owners, minlength=count)
    if len(owners) == count and (units == 1).all():
        return values[np.argsort(owners, kind="stable")]
    w = np.ones(len(owners)) if weights is None else np.asarray(weights, dtype=np.float64)
    flat = values.reshape(len(values), -1).astype(np.float64)
    total = np.zeros((count, flat.shape[1]))
    np.add.at(total, owners, flat * w[:, None])
    mean = (total / np.bincount(owners, weights=w, minlength=count)[:, None]).astype(values.dtype)
    present, first = np.unique(owners, return_index=True)
    single = units[present] == 1
    mean[present[single]] = flat[first[single]].astype(values.dtype)
    return mean.reshape(count, *values.shape[1:])


def reduce_by_owner(
    values: np.ndarray, owners: np.ndarray, count: int, ufunc: np.ufunc
) -> np.ndarray:
    """Per owner (0 .. count-1), its units' rows of ``values`` (all >= 0) combined by ``ufunc``
    (``np.maximum``: their largest value per column; ``np.add``: their sum). An owner with one
    unit gets that unit's row exactly: starting from zero, neither changes a value >= 0."""
    units = np.bincount(owners, minlength=count)
    if len(owners) == count and (units == 1).all():
        return values[np.argsort(owners, kind="stable")]
    out = np.zeros((count, *values.shape[1:]), dtype=values.dtype)
    ufunc.at(out, owners, values)
    return out


def strided(ids: np.ndarray, *, window: int, stride: int) -> list[tuple[np.ndarray, int]]:
    """A text's token ids (its BOS first) as the windows of strided perplexity, each with how
    many of its last tokens it scores: transformers' "perplexity of fixed-length models" loop.

    Window k holds ``ids[b:e]``, b = k x ``stride``, e = min(b + ``window``, len(ids)), and
    scores its tokens after the last one the window before scored (all but the BOS in the
    first window), each predicted from the window's tokens before it: every token after the
    BOS is scored once, with at least ``window - stride`` tokens of context once the text is
    past its first window. ``stride`` must be below ``window``, so each window keeps one token
    of context before the first it scores.
    """
    if not 0 < stride < window:
        raise ValueError(f"a stride of {stride} tokens needs a window above it, not {window}")
    out, scored = [], 1  # ids[:scored] are scored or the BOS
    for start in range(0, len(ids), stride):
        end = min(start + window, len(ids))
        out.append((ids[start:end], end - scored))
        scored = end
        if end == len(ids):
            break
    return out
