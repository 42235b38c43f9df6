"""The heap is set aside from the garbage collector while a run goes, and handed back after."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from batchscore.heap import Frozen, paused
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_frozen_sets_the_heap_aside_and_hands_it_back():
    assert gc.get_freeze_count() == 0
    node = Node()
    gone = weakref.ref(node)
    with Frozen() as heap:
        assert gc.get_freeze_count() > 0
        del node  # garbage now, but frozen: collections pass it over
        gc.collect()
        assert gone() is not None
        heap.more()
    assert gc.get_freeze_count() == 0
    gc.collect()  # handed back: collected as any garbage
    assert gone() is None


def test_a_process_that_froze_its_heap_keeps_its_own_arrangement():
    # The freeze count is no measure here: frozen objects freed meanwhile leave the permanent
    # generation. Whether an object is frozen shows in `gc.get_objects()`, which lists only
    # the generations the collector walks.
    before = Node()
    gc.freeze()
    try:
        with Frozen() as heap:
            during = Node()
            heap.more()
            walked = {id(o) for o in gc.get_objects()}
            assert id(during) in walked  # nothing more frozen
            assert id(before) not in walked
        walked = {id(o) for o in gc.get_objects()}
        assert id(before) not in walked  # and nothing of the process's unfrozen
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_run_leaves_the_collector_as_it_found_it(embed_job: Path):
    run_job(load_job(embed_job))
    assert gc.get_freeze_count() == 0


def test_paused_stops_collections_and_restores_the_collector():
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()  # a collector the process had turned off stays off
    finally:
        gc.enable()
