"""The progress bar and log lines count whole rows, however a row's units advance them, and a
terminal that reports no size still gets a bar."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import struct
import sys
import termios
import traceback
from fractions import Fraction
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from batchscore.observe import progress as progress_module
from batchscore.observe.progress import Progress

# a row scored as 1 to 7 units (sentences, windows) advances 1/k at a time
PARTS = st.lists(st.integers(1, 7), min_size=1, max_size=60)
COUNT = re.compile(r"(\S+)/(\d+) \[")  # tqdm's "12/30 [" (rows done / rows)
ROOT = Path(__file__).resolve().parents[2]


@settings(max_examples=300, deadline=None)
@given(parts=PARTS)
def test_the_bar_counts_whole_rows(parts: list[int]):
    stream, original = io.StringIO(), sys.stderr
    sys.stderr = stream  # tqdm writes to the stderr of when it is made
    try:
        bar = Progress(len(parts), "bar")
        done = Fraction(0)
        for units in parts:
            for _ in range(units):
                bar.advance(1 / units, tokens=3)
                done += Fraction(1, units)
                assert bar.bar.n == int(done)  # whole rows, never ahead nor a row behind
        bar.close()
    finally:
        sys.stderr = original
    counts = COUNT.findall(stream.getvalue())
    assert counts and all(done.isdigit() for done, _ in counts), counts
    assert counts[-1] == (str(len(parts)), str(len(parts)))
    event(f"units per row up to {max(parts)}")


def test_log_lines_count_whole_rows(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("batchscore"), "filters", [])  # a CLI test's level
    bar = Progress(300, "log", every_s=0.0)
    with caplog.at_level(logging.INFO, logger="batchscore"):
        for _ in range(185):
            bar.advance(1 / 3, tokens=10)
    bar.close()
    counts = [r.getMessage().split(" rows")[0] for r in caplog.records]
    assert counts[-1] == "61/300" and all("." not in c for c in counts)


CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from batchscore.observe.progress import Progress
bar = Progress(30, "bar")
for _ in range(90):
    bar.advance(1 / 3, tokens=7)
    time.sleep(0.002)
bar.close()
"""


def drawn(columns: int) -> str:
    """What a bar draws on a pseudo-terminal of ``columns`` columns (0: one with no size)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child waits until its terminal has its size, then draws
        try:  # fd 0 itself: pytest's sys.stdin refuses to be read
            os.read(0, 16)
            os.execv(sys.executable, [sys.executable, "-c", CHILD.format(root=str(ROOT))])
        except BaseException:  # said on the terminal, so a failing test shows why
            traceback.print_exc()
        finally:  # never back into pytest's own loop, in a forked copy of it
            os._exit(1)
    rows = 24 if columns else 0
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    os.write(fd, b"go\n")
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child has closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


def test_a_terminal_without_a_size_gets_the_same_bar():
    """tqdm draws nothing on a terminal that reports 0 columns; the bar falls back to 80."""
    sized, sizeless = drawn(100), drawn(0)
    for screen in (sized, sizeless):
        counts = COUNT.findall(screen)
        assert counts and counts[-1] == ("30", "30"), screen
        assert all(done.isdigit() for done, _ in counts) and "row/s" in screen
    lines = sizeless.replace("\r", "\n").splitlines()
    assert max(len(line) for line in lines) <= progress_module.FALLBACK_COLUMNS


def test_a_bar_onto_a_failing_stderr_never_stops_the_scoring(monkeypatch):
    """The Python API draws its bar on the caller's stderr, which batchscore does not guard
    for the whole process: a pipe whose reader left (or a full disk, a closed descriptor) must
    not raise out of the bar into the scoring; the caller's stderr is left as it was."""
    read, write = os.pipe()
    os.close(read)
    with io.TextIOWrapper(open(write, "wb", buffering=0), write_through=True) as gone:
        monkeypatch.setattr(sys, "stderr", gone)  # written through, as sys.stderr is
        bar = Progress(30, "bar")
        for _ in range(30):
            bar.advance(1, 5)
        bar.close()
        assert sys.stderr is gone
