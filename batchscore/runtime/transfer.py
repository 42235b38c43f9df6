"""Moving a batch between host and device: one transfer per device kind, chosen once at load
(`TRANSFERS`), so the batch loop never asks which device it runs on.

On the CPU there is nothing to move: a host array is the model's tensor, and the model's output
is the result (`HostTransfer`, `Ready`). On a GPU (`CudaTransfer`) the model must not wait on
the host:

- inputs are staged in pinned host buffers that are reused, not pinned anew per batch (pinning
  is a cudaHostAlloc; a pageable source would make the copy synchronous), and copied on a
  stream of their own, so the next batch's copy runs while the current batch computes;
- outputs are copied back on that stream too, non_blocking into pinned memory, with an event
  to wait on: the loop launches the next batch before it waits for this one's results
  (`pipeline.static.run_window`), so the host's collating, the copies and the GPU's work overlap,
  and the only host sync per batch is the wait for results the output needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

# pinned buffers kept per direction: enough for a batch's inputs (ids, mask) in flight while
# the next batch's are staged; an older buffer is reused once its copy has finished
PINNED_BUFFERS = 8


class Pending(Protocol):
    """A batch's results on their way to the host."""

    def done(self) -> bool:
        """Whether `result` would return without waiting."""
        ...

    def result(self) -> np.ndarray:
        """The results on the host, waiting for them if they are not there yet."""
        ...


class Ready:
    """Results already on the host (the CPU's, or a task that computes them there)."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def done(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        return self.value


class HostTransfer:
    """The CPU's: nothing to copy either way."""

    name = "host"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)  # no copy where the device is the CPU

    def to_host(self, tensor: torch.Tensor) -> Pending:
        return Ready(tensor.cpu().numpy())


class Pinned:
    """Reusable pinned host buffers. A buffer is free again once the copy that used it has
    finished (its event) and, for results, once they were read (`free`); the oldest copy is
    waited for when every buffer is busy, so a few stay pinned however many batches run."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.events: list[torch.cuda.Event | None] = []
        self.held: list[bool] = []  # results not read yet

    def take(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """A free buffer of at least ``nbytes`` (its slot and bytes), made or grown if needed."""
        free = [s for s in range(len(self.buffers)) if not self.held[s]]
        for slot in free:
            event = self.events[slot]
            if (event is None or event.query()) and self.buffers[slot].numel() >= nbytes:
                return slot, self.buffers[slot]
        if len(self.buffers) < PINNED_BUFFERS or not free:
            self.buffers.append(torch.empty(0, dtype=torch.uint8))
            self.events.append(None)
            self.held.append(False)
            free.append(len(self.buffers) - 1)
        slot = min(free, key=lambda s: self.buffers[s].numel())
        event = self.events[slot]
        if event is not None:
            event.synchronize()  # every buffer busy: wait for the copy using this one
        if self.buffers[slot].numel() < nbytes:  # a power of two: sizes settle after a few
            size = 1 << max(nbytes - 1, 1).bit_length()
            self.buffers[slot] = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        self.events[slot] = None
        return slot, self.buffers[slot]

    def used(self, slot: int, event: torch.cuda.Event, *, held: bool = False) -> None:
        """The buffer in ``slot`` is busy until ``event`` (and, if ``held``, until `free`)."""
        self.events[slot], self.held[slot] = event, held

    def free(self, slot: int) -> None:
        self.held[slot] = False


class CudaPending:
    """Results copied back on the copy stream into a pinned buffer: ``event`` marks them there."""

    def __init__(self, host: torch.Tensor, event: torch.cuda.Event, release: Callable[[], None]):
        self.host, self.event, self.release = host, event, release

    def done(self) -> bool:
        return bool(self.event.query())

    def result(self) -> np.ndarray:
        self.event.synchronize()  # the one host sync a batch needs: its results, for the output
        out = self.host.numpy().copy()
        self.release()  # the pinned buffer goes back to the pool
        return out


class CudaTransfer:
    """A GPU's: pinned staging buffers reused, copies on their own stream (made on first use,
    so choosing this transfer touches no GPU)."""

    name = "cuda-stream"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: torch.cuda.Stream | None = None
        self.inputs, self.outputs = Pinned(), Pinned()

    def copies(self) -> torch.cuda.Stream:
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        return self.stream

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """``array`` on the GPU, copied on the copy stream; the model's stream waits for the copy
        (an event), not the host."""
        array = np.ascontiguousarray(array)
        slot, buffer = self.inputs.take(array.nbytes)
        staged = buffer[: array.nbytes].view(torch.from_numpy(array).dtype).view(array.shape)
        staged.numpy()[...] = array  # into pinned memory, so the copy can be non_blocking
        stream, compute = self.copies(), torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            tensor = staged.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
        compute.wait_event(copied)
        tensor.record_stream(compute)  # made on the copy stream, used on the model's
        self.inputs.used(slot, copied)
        return tensor

    def to_host(self, tensor: torch.Tensor) -> Pending:
        """``tensor``'s values on their way back: the copy stream waits for the model's work
        (an event), then copies into pinned memory without blocking the host."""
        tensor = tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        slot, buffer = self.outputs.take(nbytes)
        host = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        stream, compute = self.copies(), torch.cuda.current_stream(self.device)
        computed = torch.cuda.Event()
        computed.record(compute)
        with torch.cuda.stream(stream):
            stream.wait_event(computed)
            host.copy_(tensor, non_blocking=True)
            landed = torch.cuda.Event()
            landed.record(stream)
        tensor.record_stream(stream)  # its memory is not reused before the copy has read it
        self.outputs.used(slot, landed, held=True)
        return CudaPending(host, landed, lambda: self.outputs.free(slot))


Transfer = HostTransfer | CudaTransfer
# by `torch.device.type`; a device kind not here moves data as the CPU does
TRANSFERS: dict[str, Callable[[torch.device], Transfer]] = {
    "cpu": HostTransfer,
    "cuda": CudaTransfer,
}


def transfer_for(device: torch.device) -> Transfer:
    """The transfer for ``device``, chosen once when the executor is made."""
    return TRANSFERS.get(device.type, HostTransfer)(device)
