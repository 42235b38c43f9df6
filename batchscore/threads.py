"""Overlap between stages: a producer thread runs ahead of the model, a consumer thread behind it.

Both hand items through bounded queues, so memory stays bounded and a slow stage applies
back-pressure instead of buffering without limit. Exceptions cross to the model's thread.
The model's thread is never blocked by the other two except on a full or empty queue: reading,
tokenizing and Parquet writing all release the GIL in native code.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def in_shares(work: Callable[[T], None], items: Sequence[T], threads: int) -> None:
    """Run ``work`` on every item, ``threads`` at once: each thread takes a share of the items
    (every ``threads``-th one) and works through it, rather than one task per item. A pool fed
    item by item hands each one over through a lock and wakes a thread for it: over 2,000
    one-row chunks that was 56,000 context switches beside the model, against 1,000 for one
    chunk. The first failure is raised, once every thread has stopped."""
    threads = min(threads, len(items))
    if threads <= 1:
        for item in items:
            work(item)
        return

    def share(first: int) -> None:
        for item in items[first::threads]:
            work(item)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(share, range(threads)))


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put unless told to stop; polls so a stopped consumer never leaves the producer blocked."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class Prefetch(Generic[T]):
    """Iterate ``items`` in a background thread, at most ``depth`` items ahead of the consumer,
    from construction on: the reader starts while the model is still loading. `close` stops
    the thread (iterating to the end, or leaving the loop early, closes it too); a failure of
    ``items`` is raised to the consumer at its place in the order."""

    def __init__(self, items: Iterable[T], depth: int, stop: threading.Event | None = None) -> None:
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = stop or threading.Event()  # ``items`` may wait on it too (see `Pace`)
        self.thread = threading.Thread(
            target=self._produce, args=(items,), name="batchscore-reader", daemon=True
        )
        self.thread.start()

    def _produce(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not _put(self.q, item, self.stop):
                    return
            _put(self.q, _END, self.stop)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            _put(self.q, _Failed(exc), self.stop)

    def __iter__(self) -> Iterator[T]:
        try:
            while (item := self.q.get()) is not _END:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the item in hand first)."""
        self.stop.set()
        self.thread.join()


class Sink(Generic[T]):
    """Feed items to ``consume`` in a background thread; its failure surfaces on `put`/`close`."""

    def __init__(self, consume: Callable[[T], None], depth: int) -> None:
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.consume = consume
        self.thread = threading.Thread(target=self._run, name="batchscore-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.q.get()) is not _END:
            try:
                self.consume(item)
            except BaseException as exc:
                self.error = exc
                self.stop.set()
                return

    def put(self, item: T) -> None:
        """Queue an item; raises the consumer's error if it has failed."""
        if not _put(self.q, item, self.stop) or self.error:
            raise self.error  # type: ignore[misc]

    def close(self) -> None:
        """Let the consumer finish what is queued, then raise its error if it had one."""
        _put(self.q, _END, self.stop)
        self.thread.join()
        if self.error:
            raise self.error
