"""The stage threads: `in_shares` does every item once."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.pipeline.threads import in_shares


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
