"""The local engine reads while the model loads, and gives the same output as ever."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from batchscore.engines import local
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import read_output


def test_the_first_window_is_read_while_the_model_loads(
    embed_job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The real reader and model; the model's load waits (10 s at most) for the reader's first
    window, which comes only if reading started before the load ended."""
    read_first = threading.Event()
    seen: list[bool] = []
    real_windows, real_load = local.windows, local.load_at

    def windows(*args, **kwargs):
        for window in real_windows(*args, **kwargs):
            read_first.set()
            yield window

    def load_at(*args, **kwargs):
        seen.append(read_first.wait(10))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(local, "windows", windows)
    monkeypatch.setattr(local, "load_at", load_at)
    report = run_job(load_job(embed_job))
    assert seen == [True]
    assert report["rows"] == 360 and report["chunks_committed"] == 9
    early = read_output(tmp_path / "out")
    monkeypatch.undo()
    run_job(load_job(embed_job), restart=True)  # no wait: the same rows, order and numbers
    assert read_output(tmp_path / "out").equals(early) and early.num_rows == 360


def test_a_model_that_fails_to_load_stops_the_reader(
    embed_job: Path, monkeypatch: pytest.MonkeyPatch
):
    def load_at(*args, **kwargs):
        raise OSError("weights unreadable")

    monkeypatch.setattr(local, "load_at", load_at)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(OSError, match="weights unreadable"):
        run_job(load_job(embed_job))
    left = [t for t in threading.enumerate() if t.ident not in before]
    assert not [t for t in left if t.name == "batchscore-reader"]
