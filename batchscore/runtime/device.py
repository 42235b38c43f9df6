"""The device a model runs on: which one a job's `[model].device` names on this machine, the
threads torch runs CPU kernels with, and how running out of its memory shows.

Resolved once, before anything is loaded; the executor (`batchscore.runtime.executor`) holds
what is resolved here.
"""

from __future__ import annotations

import torch

from batchscore.errors import JobError


def resolve_device(spec: str) -> torch.device:
    """Turn ``auto | cpu | cuda | cuda:N`` into a device this machine has."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise JobError(f'[model].device: "{spec}" asked for, but this machine has no CUDA GPU')
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise JobError(
                f'[model].device: "{spec}" asked for, but only {torch.cuda.device_count()} GPU(s)'
            )
    return device


def device_reason(spec: str) -> str:
    """Why ``[model].device`` resolves as it does, for the run's debug log."""
    if spec != "auto":
        return "the job's [model].device"
    if torch.cuda.is_available():
        return f"auto: CUDA is available ({torch.cuda.get_device_name(0)})"
    return "auto: no CUDA GPU here"


def torch_threads() -> int:
    """The intra-op threads torch runs CPU kernels with."""
    return torch.get_num_threads()


# How running out of memory reads where torch raises a plain RuntimeError, not OutOfMemoryError:
# the CPU allocator; a CUDA kernel launch or cudaMalloc outside the caching allocator (a
# torch.compile'd kernel, a custom op); cuBLAS or cuDNN failing to allocate their workspace on
# a full GPU (the first matmul after the cache filled up, say).
OUT_OF_MEMORY = (
    "can't allocate memory",
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or any of the other ways running out of memory is raised
    (`OUT_OF_MEMORY`): each is a batch too large, to be halved, never a failed shard."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OUT_OF_MEMORY)
