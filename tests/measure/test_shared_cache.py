"""The decision cache in a folder other users can reach (a team volume, a mounted cache): what
is planted at `decisions.json` is never followed, never waited on and never read past a cap, and
a folder or file that someone else could change is not trusted. Each is a warning and a cold
run, as a missing cache is; the run never hangs holding its lock."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchscore.measure.cache import FILE, MAX_BYTES, DecisionCache, Entry, Measured
from tests.commands import environment, run
from tests.output.test_links import tree
from tests.reliability import make_job

AUTO = ["model.precision=auto", "batching.max_tokens=auto", "quality.sample_rows=24"]
ENTRY = Entry({"int8": Measured(speedup=2.0, load_s=1.0)}).to_json()
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")

# In a fresh process, so that a read that hangs (a FIFO) ends with the timeout instead of the
# test run, and a read without end (/dev/zero) with a MemoryError under the address-space cap
# instead of the machine's memory.
PROBE = """
import json, logging, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from batchscore.measure.cache import DecisionCache, Measured
cache = DecisionCache(Path(sys.argv[1]))
print(json.dumps(cache.get("key") is not None))
cache.learn("key", {"int8": Measured(speedup=3.0, load_s=1.0)})
"""


def plant(cache: Path, elsewhere: Path, kind: str) -> None:
    """Put ``kind`` where `decisions.json` goes in ``cache``; what it points to in ``elsewhere``
    (a file there holds a valid entry, which must not be used)."""
    place = cache / FILE
    if kind == "FIFO":
        os.mkfifo(place)
    elif kind == "link to a FIFO":
        os.mkfifo(elsewhere / "fifo")
        place.symlink_to(elsewhere / "fifo")
    elif kind == "link to /dev/zero":
        place.symlink_to("/dev/zero")
    elif kind == "link to a file elsewhere":
        (elsewhere / "theirs.json").write_text(json.dumps({"key": ENTRY}))
        place.symlink_to(elsewhere / "theirs.json")
    elif kind == "folder":
        place.mkdir()
        (place / "inside").write_text("someone's\n")
    elif kind == "huge file":
        with place.open("wb") as fh:  # sparse: no disk, but an endless-looking read
            fh.write(json.dumps({"key": ENTRY}).encode())
            fh.truncate(8 << 30)


KINDS = ["FIFO", "link to a FIFO", "link to /dev/zero", "link to a file elsewhere", "folder"]


@pytest.mark.parametrize("kind", [*KINDS, "huge file"])
def test_whatever_is_planted_at_the_cache_is_a_warning_and_a_cold_read(tmp_path: Path, kind):
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    elsewhere.mkdir()
    plant(cache, elsewhere, kind)
    before = tree(elsewhere)

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(cache)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "false"  # nothing planted is used
    assert f"{cache / FILE}: " in probe.stderr and "measuring again" in probe.stderr
    assert tree(elsewhere) == before  # nothing it points to was written
    if kind.startswith("link"):  # replaced by this run's own file, never written through
        assert not (cache / FILE).is_symlink() and json.loads((cache / FILE).read_text())


def test_a_fifo_at_the_cache_neither_hangs_the_run_nor_blocks_the_next(tmp_path, small_corpus):
    """The issue's case as cron meets it: the run used to wait on the FIFO forever, holding
    the output's lock, and every later tick exited 75."""
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    os.mkfifo(cache / FILE)
    sets = [a for s in [*AUTO, f'quality.cache_dir="{cache}"'] for a in ("--set", s)]

    first = run(job, *sets, timeout=240)
    assert first.returncode == 0, first.stderr
    assert f"{cache / FILE}: is a FIFO, not a regular file" in first.stderr
    assert run(job, *sets, timeout=240).returncode == 0  # the next tick: done, not locked out


def write_entry(cache: Path) -> None:
    cache.mkdir(exist_ok=True)
    (cache / FILE).write_text(json.dumps({"key": ENTRY}))


def used(cache: Path, caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the entry in ``cache`` is used (and then what is learnt is kept there)."""
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        found = DecisionCache(cache).get("key") is not None
        DecisionCache(cache).learn("key", {"bf16": Measured(speedup=1.1, load_s=1.0)})
    return found


def kept(cache: Path) -> set[str]:
    """The precisions the cache file in ``cache`` holds for the key."""
    return set(json.loads((cache / FILE).read_text())["key"]["measured"])


def test_a_folder_every_user_can_write_is_not_trusted(tmp_path: Path, caplog):
    cache = tmp_path / "cache"
    write_entry(cache)
    cache.chmod(0o777)
    assert not used(cache, caplog)
    assert f"{cache}: is writable by every user (mode drwxrwxrwx)" in caplog.text
    assert "measuring again" in caplog.text
    assert kept(cache) == {"int8"}  # nothing written there either


def test_a_sticky_folder_like_tmp_keeps_this_users_own_file(tmp_path: Path, caplog):
    """In a sticky folder others may add names but not replace this user's file."""
    cache = tmp_path / "cache"
    write_entry(cache)
    cache.chmod(0o1777)
    assert used(cache, caplog) and not caplog.text
    assert kept(cache) == {"int8", "bf16"}


def test_a_file_every_user_can_write_is_not_trusted(tmp_path: Path, caplog):
    cache = tmp_path / "cache"
    write_entry(cache)
    (cache / FILE).chmod(0o666)
    assert not used(cache, caplog)
    assert f"{cache / FILE}: is writable by every user" in caplog.text
    # in this user's own folder it is replaced by this user's file, holding what was learnt
    assert kept(cache) == {"bf16"} and os.stat(cache / FILE).st_mode & 0o022 == 0


def test_the_users_own_private_group_may_write(tmp_path: Path, caplog):
    """A 002 umask makes the user's files writable by the user's own group (the group of the
    user's name, no one else in it): that is no one else."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid())
    if group.gr_name != me or set(group.gr_mem) - {me}:
        pytest.skip("this user has no private group")
    cache = tmp_path / "cache"
    write_entry(cache)
    cache.chmod(0o775)
    (cache / FILE).chmod(0o664)
    assert used(cache, caplog) and not caplog.text
    assert kept(cache) == {"int8", "bf16"}


@as_root
def test_another_users_file_or_group_is_not_trusted(tmp_path: Path, caplog):
    cache = tmp_path / "cache"
    write_entry(cache)
    os.chown(cache / FILE, 12345, -1)
    assert not used(cache, caplog)
    assert f"{cache / FILE}: belongs to another user (uid 12345)" in caplog.text
    assert kept(cache) == {"bf16"} and os.stat(cache / FILE).st_uid == os.geteuid()
    caplog.clear()
    write_entry(cache)
    os.chown(cache, -1, 12345)
    cache.chmod(0o775)
    assert not used(cache, caplog)
    assert f"{cache}: is writable by group 12345" in caplog.text
    assert kept(cache) == {"int8"}


def test_the_cap_is_far_above_any_real_cache(tmp_path: Path):
    """Hundreds of models on one machine stay well under the cap (an entry is a few hundred
    bytes), so the cap never turns a real cache away."""
    cache = DecisionCache(tmp_path)
    measured = {p: Measured(speedup=1.5, load_s=2.0, calibrate_s=0.1) for p in ("int8", "bf16")}
    for n in range(50):
        key = f"{n:016x} | embed | max_length=512 | cpu Intel(R) Xeon(R) x64 | torch 2.9.0"
        cache.put(key, Entry(measured, {"fp16": "no fp16 kernels on this CPU"}))
    assert (tmp_path / FILE).stat().st_size / 50 * 10_000 < MAX_BYTES  # 10,000 models
