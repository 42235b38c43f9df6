"""The stage threads: `in_shares` does every item once, `Prefetch` reads ahead from the start
and stops when told."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.threads import Prefetch, in_shares


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.integers(), max_size=300), threads=st.integers(1, 16))
def test_in_shares_works_every_item_once(items: list[int], threads: int):
    done: list[int] = []
    workers: set[int] = set()
    lock = threading.Lock()

    def work(item: int) -> None:
        with lock:
            done.append(item)
            workers.add(threading.get_ident())

    in_shares(work, items, threads)
    assert sorted(done) == sorted(items)
    assert len(workers) <= max(1, min(threads, len(items)))


def test_in_shares_raises_the_failure_after_every_thread_stopped():
    running = threading.Event()
    finished: list[int] = []

    def work(item: int) -> None:
        if item == 0:
            running.wait(5)
            raise OSError("disk full")
        running.set()
        time.sleep(0.01)
        finished.append(item)

    with pytest.raises(OSError, match="disk full"):
        in_shares(work, [0, 1, 2, 3], 2)  # 0 and 2 in one share, 1 and 3 in the other
    assert sorted(finished) == [1, 3]  # the other share ran to its end before the raise


def test_prefetch_reads_ahead_before_anyone_iterates():
    started = threading.Event()

    def items():
        started.set()
        yield from range(5)

    reading = Prefetch(items(), depth=2)
    assert started.wait(5)  # the reader ran before the first `next`
    assert list(reading) == [0, 1, 2, 3, 4]
    assert not reading.thread.is_alive()


def test_prefetch_raises_a_failure_in_its_place():
    def items():
        yield 1
        raise ValueError("shard 2 is not Parquet")

    got = []
    with pytest.raises(ValueError, match="shard 2"):
        for item in Prefetch(items(), depth=2):
            got.append(item)
    assert got == [1]


def test_prefetch_close_stops_a_reader_that_never_ends():
    reading = Prefetch(itertools.count(), depth=2)  # blocks on its full queue
    time.sleep(0.05)
    reading.close()
    assert not reading.thread.is_alive()


def test_leaving_the_loop_early_stops_the_reader():
    reading = Prefetch(itertools.count(), depth=2)
    for item in reading:
        if item == 3:
            break
    del item
    reading.close()  # idempotent after the loop's own close
    assert not reading.thread.is_alive()
