"""Token states to one vector per row: every pooling mode sentence-transformers defines.

Rows are right-padded, so a row's real tokens are its first ``mask.sum()`` positions. With
``skip`` (a prompt the model's Pooling leaves out), the first ``skip`` positions are masked out
of the pooling, though the model still attended to them.
"""

from __future__ import annotations

import torch


def pool(
    hidden: torch.Tensor, mask: torch.Tensor, modes: str | tuple[str, ...], skip: int = 0
) -> torch.Tensor:
    """Reduce token states [batch, tokens, dim] to [batch, dim x modes], ignoring padding.

    Several modes are concatenated in the order given, as sentence-transformers does.
    """
    if skip:
        mask = mask.clone()
        mask[:, :skip] = 0
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    out = []
    for mode in (modes,) if isinstance(modes, str) else modes:
        if mode == "cls":  # the first token pooled (the one after the prompt, when it is skipped)
            out.append(hidden[rows, mask.int().argmax(dim=1)])
        elif mode == "max":
            out.append(hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total, count = (hidden * weights).sum(dim=1), weights.sum(dim=1).clamp(min=1e-9)
            out.append(total / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":  # later tokens weigh more: position 1, 2, 3, ...
            position = torch.arange(1, hidden.shape[1] + 1, device=hidden.device)
            weighted = weights * position.view(1, -1, 1).to(hidden.dtype)
            out.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = hidden.shape[1] - 1 - mask.flip(1).int().argmax(dim=1)
            out.append(hidden[rows, last] * weights[rows, last])
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return torch.cat(out, dim=-1)
