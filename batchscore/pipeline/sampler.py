"""Length-bucketing sampler: token lengths in, batches of row indices out. Pure, no I/O, no torch.

A batch costs rows x its longest row, because every row is padded to that length. Sorting a window
by length puts rows of similar length side by side; the cut points are then chosen by dynamic
programming to minimise padded tokens plus a fixed cost per batch, instead of greedily filling
the budget (which pads the last short rows of a batch up to the first long ones).
"""

from __future__ import annotations

import numpy as np

# Fixed cost of one forward call, in tokens: it stops the cut from splitting into many tiny batches
# to save a few pad tokens, which would cost more in per-call overhead than the padding it avoids.
# Measured with docs/studies/padding_study.py (BENCHMARKS.md): fp32 runs as fast at 16 to 128, bf16
# (whose per-token work is smaller next to the per-call cost) is fastest at 32 and 15% slower at 16.
BATCH_OVERHEAD_TOKENS = 32


def form_batches(
    lengths: np.ndarray,
    max_tokens: int,
    max_rows: int,
    sort: bool = True,
    overhead: int = BATCH_OVERHEAD_TOKENS,
) -> list[np.ndarray]:
    """Group row indices into batches with rows <= max_rows and rows x longest <= max_tokens.

    With ``sort`` the rows are length-sorted and cut optimally; without it they stay in input
    order and each batch is filled until the next row would break a limit (the naive baseline).
    """
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if lengths.size and lengths.max() > max_tokens:
        raise ValueError(f"a row of {lengths.max()} tokens exceeds max_tokens={max_tokens}")
    if sort:
        return sorted_batches(lengths, max_tokens, max_rows, overhead)
    return sequential_batches(lengths, max_tokens, max_rows)


def sorted_batches(
    lengths: np.ndarray, max_tokens: int, max_rows: int, overhead: int
) -> list[np.ndarray]:
    """Optimal contiguous cut of the length-sorted rows (O(n x max_rows), vectorised per row)."""
    n = lengths.size
    order = np.argsort(lengths, kind="stable")
    sorted_len = lengths[order]
    best = np.zeros(n + 1, dtype=np.int64)  # best[j]: least cost of batching the j shortest rows
    cut = np.zeros(n + 1, dtype=np.int64)  # cut[j]: where the last batch of that best plan starts
    for j in range(1, n + 1):
        longest = int(sorted_len[j - 1])
        width = min(max_rows, max_tokens // longest, j)
        starts = np.arange(j - width, j)
        cost = best[j - width : j] + (j - starts) * longest
        k = int(np.argmin(cost))  # first minimum: the largest batch among equally cheap ones
        best[j], cut[j] = cost[k] + overhead, starts[k]
    batches, j = [], n
    while j > 0:
        batches.append(order[cut[j] : j])
        j = int(cut[j])
    return batches[::-1]


def sequential_batches(lengths: np.ndarray, max_tokens: int, max_rows: int) -> list[np.ndarray]:
    """Input-order batches, each cut when one more row would exceed max_rows or max_tokens."""
    batches, start, longest = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        grown = max(longest, length)
        if i > start and (i - start >= max_rows or (i - start + 1) * grown > max_tokens):
            batches.append(np.arange(start, i))
            start, grown = i, length
        longest = grown
    if lengths.size:
        batches.append(np.arange(start, lengths.size))
    return batches


def restore(
    batches: list[np.ndarray], outputs: list[np.ndarray], empty: np.ndarray, size: int | None = None
) -> np.ndarray:
    """Put per-batch outputs back in input order: row ``batches[b][i]`` gets ``outputs[b][i]``.

    ``size`` makes room for rows no batch covered (left unset, for the caller to fill).
    """
    if not batches:
        return empty
    order, flat = np.concatenate(batches), np.concatenate(outputs)
    result = np.empty((size or len(flat), *flat.shape[1:]), dtype=flat.dtype)
    result[order] = flat
    return result


def first_of_each(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """De-duplicate: the first index of each distinct key, and for every index that first index.

    Identical inputs (the same token ids) are scored once and their result copied.
    """
    first: dict[bytes, int] = {}
    same_as = np.fromiter(
        (first.setdefault(k, i) for i, k in enumerate(keys)), dtype=np.int64, count=len(keys)
    )
    return np.flatnonzero(same_as == np.arange(len(keys))), same_as


def padded_tokens(lengths: np.ndarray, batches: list[np.ndarray]) -> int:
    """Tokens the model processes for these batches, padding included."""
    lengths = np.asarray(lengths)
    return int(sum(len(b) * int(lengths[b].max()) for b in batches if len(b)))
