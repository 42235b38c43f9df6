"""`Guarded`: a standard stream whose failures are remembered, never raised; descriptors 0-2
reserved where the process started with them closed. The commands' behaviour over every
stream: tests/test_streams.py."""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest

from batchscore.observe.streams import Guarded
from tests.commands import environment


def gone_pipe() -> io.TextIOWrapper:
    """A text stream onto a pipe whose reader has left."""
    read, write = os.pipe()
    os.close(read)
    return open(write, "w")  # closed by the test


@pytest.mark.parametrize("owned", [True, False])
def test_a_failed_flush_is_remembered_and_later_writes_are_dropped(owned: bool):
    """The process's own stream (``owned``) points its descriptor at /dev/null, so what the
    stream still buffers goes there at exit, not to the broken pipe again; a stream of a
    program that called batchscore keeps its descriptor, for that program to decide."""
    inner = gone_pipe()
    stream = Guarded(inner, "stdout", owned=owned)
    assert stream.write("first line\n") == len("first line\n")  # buffered: no failure yet
    stream.flush()
    assert stream.failure is not None and stream.failure.errno == errno.EPIPE
    assert stream.write("more\n") == len("more\n")  # dropped, not raised
    stream.flush()
    assert stat.S_ISFIFO(os.fstat(inner.fileno()).st_mode) is not owned
    if owned:
        inner.close()  # what it still buffered goes to /dev/null
    else:
        with pytest.raises(BrokenPipeError):
            inner.close()


def test_click_writes_through_it_as_through_a_text_file(tmp_path: Path):
    """click tells a text stream from a binary one by writing b"" to it: refused, as a text
    file refuses it, so click writes text, which reaches the file whole."""
    with open(tmp_path / "out.txt", "w") as inner:
        stream = Guarded(inner, "stdout")
        with pytest.raises(TypeError):
            stream.write(b"")  # type: ignore[arg-type]
        click.echo("caf\u00e9", file=stream)
    assert (tmp_path / "out.txt").read_text() == "caf\u00e9\n"
    assert stream.failure is None


def test_a_stream_closed_when_the_process_started_fails_every_write():
    stream = Guarded(None, "stderr")
    stream.flush()
    assert stream.failure is None  # nothing was lost yet: `run -q >&-` says nothing of it
    assert stream.write("lost\n") == 5 and not stream.isatty()
    assert stream.failure is not None and stream.failure.errno == errno.EBADF
    with pytest.raises(io.UnsupportedOperation):
        stream.fileno()  # tqdm and the bar's width ask; both take this for "no terminal"


def test_a_descriptor_closed_at_start_is_not_handed_to_the_next_file(tmp_path: Path):
    """With stdout and stderr closed (``>&- 2>&-``), the next file opened would be descriptor
    1, and what a C library writes to "stdout" would land in it: `guard` holds 0-2 open on
    /dev/null first, so the file gets a descriptor of its own."""
    probe = tmp_path / "fd"
    code = (
        "import os, sys; from batchscore.observe.streams import guard; guard(); "
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT); os.write(fd, str(fd).encode()); "
        "os.write(1, b'into /dev/null'); os.write(2, b'into /dev/null')"
    )
    line = [sys.executable, "-c", code, str(probe)]
    done = subprocess.run(["bash", "-c", 'exec "$@" >&- 2>&-', "bash", *line], env=environment())
    assert done.returncode == 0
    assert int(probe.read_text()) > 2
