"""Every output stream, for every command, in real subprocesses: stdout or stderr closed
(``>&-``, ``2>&-``), full (``/dev/full``), or a pipe whose reader left (at once, or after the
first line, as ``| head -1`` does).

The rule (docs/commands.md#when-stdout-or-stderr-fails): a stream that fails never stops the
work, and the exit status tells the truth about the work, never about the terminal. A command
whose work is files (`run`, `run-batch`, `report -o`) exits as its work did, whatever became of
its summary; a command whose product is what it prints (`validate`, `status`, `plan`, `check`,
`report --json`, `--help`, `--version`) fails when it could not deliver it: 141 when the reader
left (quietly, as a command killed by SIGPIPE), 74 when stdout could not be written (with
``write error on stdout: ...`` on stderr). A failing stderr never changes the exit status.

The subprocesses start together, a few at a time (`outcomes`), as each costs the start-up of
torch; the read-only commands share one committed job folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchscore.errors import BROKEN_PIPE, WRITE_FAILED
from tests.commands import environment
from tests.output.tiny import glob_ids, tiny_job, write_shard

ROWS = 10
EMBED_MODEL = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Verb:
    """A command line (``{job}``, ``{folder}`` filled in); ``product``: stdout is what it
    makes; ``fresh``: it needs its own job folder (it writes); ``says``: in its stdout when
    it is delivered whole."""

    args: tuple[str, ...]
    product: bool
    says: str
    fresh: bool = False


VERBS = {
    "run": Verb(("run", "{job}", "-v", "--progress", "bar"), False, "10 rows scored", fresh=True),
    "run-json": Verb(
        ("--log-format", "json", "run", "{job}", "-v", "--progress", "log"),
        False,
        '"event": "summary"',
        fresh=True,
    ),
    "run-batch": Verb(
        (
            *("run-batch", "-i", "{folder}/requests.jsonl", "-o", "{folder}/results.jsonl"),
            *("--model", EMBED_MODEL, "--set", "model.precision=fp32"),
        ),
        False,
        "2 results, 0 of them errors",
        fresh=True,
    ),
    "report": Verb(("report", "{job}", "-o", "{folder}/report.html"), False, "report.html"),
    "validate": Verb(("validate", "{job}"), True, "job.toml: ok"),
    "plan": Verb(("plan", "{job}"), True, "plan for job"),
    "status": Verb(("status", "{job}"), True, "rows committed - complete"),
    "status-check": Verb(("status", "{job}", "--check"), True, "complete"),
    "status-json": Verb(("status", "{job}", "--json"), True, '"complete": true'),
    "status-log-json": Verb(("--log-format", "json", "status", "{job}"), True, '"event": "status"'),
    "check": Verb(("check", "{job}"), True, "fp32"),
    "report-json": Verb(("report", "{job}", "--json"), True, '"figures"'),
    "help": Verb(("--help",), True, "Usage:"),
    "version": Verb(("--version",), True, "batchscore, version"),
}
# how the streams are set up: (stdout, stderr) for subprocess, or a shell line around "$@"
STREAMS = (
    "stdout-closed",
    "stdout-full",
    "stdout-gone",  # a pipe whose reader closed it before the command wrote a thing
    "stdout-head",  # `| head -1`: the reader leaves after the first line
    "stderr-closed",
    "stderr-full",
)
SHELL = {
    "stdout-closed": 'exec "$@" >&-',
    "stderr-closed": 'exec "$@" 2>&-',
    "stdout-head": '"$@" | head -1; exit "${PIPESTATUS[0]}"',
}


@dataclass
class Outcome:
    code: int
    stdout: str | None  # None where the stream is not readable
    stderr: str | None
    folder: Path


def launch(verb: Verb, streams: str, folder: Path, cache: Path) -> Outcome:
    """``batchscore`` as ``verb`` says, its streams as ``streams`` says, to its end."""
    job = folder / "job.toml"
    args = [a.format(job=job, folder=folder) for a in verb.args]
    line = [sys.executable, "-m", "batchscore", *args]
    env = environment(XDG_CACHE_HOME=str(cache))
    stdout: int | None = subprocess.PIPE
    stderr: int | None = subprocess.PIPE
    opened: list[int] = []
    if streams in SHELL:
        line = ["bash", "-c", SHELL[streams], "bash", *line]
        if streams == "stdout-closed":
            stdout = subprocess.DEVNULL  # the shell closes it for the command
        if streams == "stderr-closed":
            stderr = subprocess.DEVNULL
    elif streams.endswith("-full"):
        opened.append(os.open("/dev/full", os.O_WRONLY))
        stdout, stderr = (opened[0], stderr) if streams == "stdout-full" else (stdout, opened[0])
    elif streams == "stdout-gone":
        read, write = os.pipe()
        os.close(read)
        opened.append(write)
        stdout = write
    try:
        done = subprocess.run(
            line, cwd=folder, env=env, stdout=stdout, stderr=stderr, text=True, timeout=300
        )
    finally:
        for fd in opened:
            os.close(fd)
    readable_out = stdout == subprocess.PIPE and streams != "stdout-closed"
    readable_err = stderr == subprocess.PIPE
    return Outcome(
        done.returncode,
        done.stdout if readable_out else None,
        done.stderr if readable_err else None,
        folder,
    )


def make_job(folder: Path) -> Path:
    """The tiny tensor job, one shard of `ROWS` rows, and a request file for run-batch."""
    job = tiny_job(folder)
    write_shard(folder / "in" / "a.parquet", ROWS)
    requests = [
        {"custom_id": name, "method": "POST", "url": "/v1/embeddings"}
        | {"body": {"model": EMBED_MODEL, "input": f"the word {name}"}}
        for name in ("a", "b")
    ]
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    return job


def chosen(request: pytest.FixtureRequest, verb: str) -> set[str]:
    """The streams ``verb``'s cases in this session are run with."""
    return {
        item.callspec.params["streams"]
        for item in request.session.items
        if item.nodeid.startswith(f"{request.node.nodeid}::")
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("verb") == verb
    }


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, str], Outcome]]:
    """A command's outcome with its streams set up so: the first case of a command starts
    every case of it this session runs, three at a time (each process costs torch's start-up).
    The read-only commands run in one job folder whose output is committed, `run` and
    `run-batch` each in a fresh one."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    shared = tmp_path_factory.mktemp("committed")
    make_job(shared)
    first = launch(Verb(("run", "{job}", "--progress", "off"), False, ""), "", shared, cache)
    assert first.code == 0, first.stderr
    futures: dict[tuple[str, str], Future[Outcome]] = {}

    def start(name: str, streams: str) -> None:
        folder = shared
        if VERBS[name].fresh:
            folder = tmp_path_factory.mktemp(f"{name}-{streams}")
            make_job(folder)
        futures[name, streams] = pool.submit(launch, VERBS[name], streams, folder, cache)

    def outcome(name: str, streams: str) -> Outcome:
        if (name, streams) not in futures:
            for each in sorted(chosen(request, name) | {streams}):
                start(name, each)
        return futures[name, streams].result()

    with ThreadPoolExecutor(3) as pool:
        yield outcome


def expected_code(verb: Verb, streams: str) -> set[int]:
    """The documented exit statuses of ``verb`` with its streams as ``streams`` says."""
    if not verb.product or streams.startswith("stderr"):
        return {0}
    if streams == "stdout-gone":
        return {BROKEN_PIPE}
    if streams == "stdout-head":  # 0 where all of it reached the pipe before the reader left
        return {0, BROKEN_PIPE}
    return {WRITE_FAILED}


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_failing_stream_never_stops_the_work_and_the_status_tells_the_truth(
    outcomes: Callable[[str, str], Outcome], verb: str, streams: str
):
    """No traceback, the documented status, and for a command whose work is files the work
    done: `run`'s folder complete (``_SUCCESS``, every row), `run-batch`'s results written."""
    done, spec = outcomes(verb, streams), VERBS[verb]
    said = f"stdout: {done.stdout!r}\nstderr: {done.stderr!r}"
    assert done.code in expected_code(spec, streams), said
    if done.stderr is not None:
        assert "Traceback" not in done.stderr, said
        assert "internal error" not in done.stderr, said
        if "--log-format" in spec.args:  # every line JSON, the write error's too
            assert all(json.loads(line) for line in done.stderr.splitlines()), said
        lost = streams in ("stdout-closed", "stdout-full")
        words = {"stdout-closed": "Bad file descriptor", "stdout-full": "No space left on device"}
        if lost:  # said on stderr, an error where the product is lost, else a warning
            assert f"write error on stdout: {words[streams]}" in done.stderr, said
            kind = "error" if spec.product else "warning"
            assert f'"level": "{kind}"' in done.stderr or f"batchscore: {kind}:" in done.stderr
        else:  # a reader that left is no error: nothing said
            assert "write error" not in done.stderr and "Broken pipe" not in done.stderr, said
    if streams.startswith("stderr"):  # stdout delivered whole
        assert done.stdout is not None and spec.says in done.stdout, said
    if streams == "stdout-head":
        assert done.stdout is not None and len(done.stdout.splitlines()) <= 1, said
    if verb.startswith("run") and verb != "run-batch":
        assert (done.folder / "out" / "_SUCCESS").is_file(), said
        assert len(glob_ids(done.folder / "out")) == ROWS, said
    if verb == "run-batch":
        assert len((done.folder / "results.jsonl").read_text().splitlines()) == 2, said


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_run_with_no_stream_left_commits_everything_and_exits_0(tmp_path: Path, stderr: str):
    """stderr closed or full and stdout a pipe its reader closed before the run wrote a thing:
    the bar and every log line of the run fail (``-v``: a line per chunk), and the run still
    commits every chunk, writes ``_SUCCESS`` and exits 0, its work done."""
    job = make_job(tmp_path)
    read, write = os.pipe()
    os.close(read)
    line = [sys.executable, "-m", "batchscore", "run", str(job), "-v", "--progress", "bar"]
    err = os.open("/dev/full", os.O_WRONLY) if stderr == "full" else None
    if err is None:
        line = ["bash", "-c", 'exec "$@" 2>&-', "bash", *line]
    try:
        done = subprocess.run(line, cwd=tmp_path, env=environment(), stdout=write, stderr=err)
    finally:
        os.close(write)
        if err is not None:
            os.close(err)
    assert done.returncode == 0
    assert (tmp_path / "out" / "_SUCCESS").is_file()
    assert len(glob_ids(tmp_path / "out")) == ROWS


def test_a_broken_pipe_inside_the_work_is_a_bug_with_its_traceback(tmp_path: Path):
    """A broken pipe that is not stdout's (a socket's, within the work) is an internal error:
    its traceback and exit 1, where click alone would end the process silently with 1."""
    job = make_job(tmp_path)
    line = [sys.executable, "-m", "batchscore", "run", str(job), "--progress", "off"]
    env = environment("model-batch:epipe")
    done = subprocess.run(line, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "BrokenPipeError" in done.stderr, done.stderr


def test_the_works_own_failure_outranks_a_product_lost(tmp_path: Path):
    """`status --check` on a folder not yet complete, its stdout full: 13, the status a
    scheduler gates on, not 74; the write error is said as well."""
    job = make_job(tmp_path)
    line = [sys.executable, "-m", "batchscore", "status", str(job), "--check"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            line, cwd=tmp_path, env=environment(), stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 13, done.stderr
    assert "write error on stdout: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr
