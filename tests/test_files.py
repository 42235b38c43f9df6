"""Files in shared places: a read never follows a link, never waits on a FIFO, never reads past
its cap; a temporary file is only ever made new; who may change a file is judged as a careful
user would (another user's or writable by others: not trusted; root's, or the user's own
private group's: trusted)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore import files
from batchscore.files import (
    Refused,
    create_temp,
    read_shared,
    replace_durably,
    writable_by_others,
    write_new,
)

LIMIT = 64


def make(place: Path, kind: str, outside: Path) -> None:
    if kind == "small file":
        place.write_bytes(b"x" * LIMIT)
    elif kind == "file past the cap":
        place.write_bytes(b"x" * (LIMIT + 1))
    elif kind == "link to a file":
        (outside / "file").write_text("theirs")
        place.symlink_to(outside / "file")
    elif kind == "link to /dev/zero":
        place.symlink_to("/dev/zero")
    elif kind == "dangling link":
        place.symlink_to(outside / "nothing")
    elif kind == "FIFO":
        os.mkfifo(place)
    elif kind == "folder":
        place.mkdir()
    elif kind == "under a file":
        place.parent.rmdir()
        place.parent.write_text("a file where the folder goes")


EXPECTED = {  # kind -> what read_shared gives: bytes, None, or the Refused message's end
    "small file": b"x" * LIMIT,
    "nothing": None,
    "under a file": None,
    "file past the cap": f"holds {LIMIT + 1} bytes, more than the {LIMIT} read",
    "link to a file": "is a symbolic link",
    "link to /dev/zero": "is a symbolic link",
    "dangling link": "is a symbolic link",
    "FIFO": "is a FIFO, not a regular file",
    "folder": "is a folder, not a regular file",
}


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(EXPECTED)))
def test_read_shared_reads_a_regular_file_and_refuses_anything_else(tmp_path_factory, kind: str):
    root = tmp_path_factory.mktemp("shared")
    (root / "folder").mkdir()
    (root / "outside").mkdir()
    place = root / "folder" / "file.json"
    make(place, kind, root / "outside")
    expected = EXPECTED[kind]
    if isinstance(expected, str):
        with pytest.raises(Refused, match=f"^{place}: {expected}$") as refused:
            read_shared(place, LIMIT)
        assert refused.value.link == ("link" in kind)
    else:
        assert read_shared(place, LIMIT) == expected


def test_a_vet_refuses_on_the_open_file(tmp_path: Path):
    (tmp_path / "f").write_text("{}")
    with pytest.raises(Refused, match="not mine") as refused:
        read_shared(tmp_path / "f", LIMIT, vet=lambda info: "not mine")
    assert refused.value.vetted and not refused.value.link
    assert read_shared(tmp_path / "f", LIMIT, vet=lambda info: None) == b"{}"


def info(mode: int, uid: int, gid: int = 4321) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "owner", "folder", "problem"),
    [
        (0o100644, "me", False, None),
        (0o100600, "root", False, None),  # an image's baked-in cache, read by a container user
        (0o100644, "stranger", False, "belongs to another user (uid 777)"),
        (0o100666, "me", False, "is writable by every user (mode -rw-rw-rw-)"),
        (0o100664, "me", False, "is writable by group 4321 (mode -rw-rw-r--)"),
        (0o040755, "me", True, None),
        (0o040777, "me", True, "is writable by every user (mode drwxrwxrwx)"),
        (0o041777, "root", True, None),  # /tmp: others add names, never replace this user's
        (0o041777, "stranger", True, "belongs to another user (uid 777)"),
        (0o040775, "me", True, "is writable by group 4321 (mode drwxrwxr-x)"),
    ],
)
def test_who_else_could_change_it(monkeypatch, mode: int, owner: str, folder: bool, problem):
    """As a user (uid 1000) who is not root and whose group is not 4321: the process's ids
    are set for the check, as only root could make files of another user's here."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    uid = {"me": 1000, "root": 0, "stranger": 777}[owner]
    assert writable_by_others(info(mode, uid), folder=folder) == problem


def test_the_users_own_private_group_is_no_one_else(monkeypatch):
    """A 002 umask (Debian, Ubuntu) makes files writable by the user's private group."""
    monkeypatch.setattr(files, "private_group", lambda gid: gid == 4321)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert writable_by_others(info(0o100664, 1000), folder=False) is None
    assert writable_by_others(info(0o100664, 1000, gid=99), folder=False) is not None


def test_a_temporary_file_is_made_new_never_at_a_planted_name(tmp_path: Path, monkeypatch):
    """Names come from a random part; one that is taken (here: the first two, with a link
    and a hard link to a file outside) is passed over, never opened."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    names = iter(["aaaa", "bbbb", "cccc"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    final = tmp_path / "out" / "m.prom"
    final.parent.mkdir()
    pid = os.getpid()
    (final.parent / f".m.prom.{pid}.aaaa.tmp").symlink_to(victim)
    os.link(victim, final.parent / f".m.prom.{pid}.bbbb.tmp")
    fd, tmp = create_temp(final)
    os.close(fd)
    assert tmp.name == f".m.prom.{pid}.cccc.tmp" and tmp.stat().st_size == 0
    assert victim.read_text() == "precious"


def test_write_new_never_opens_what_is_there(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for planted in (tmp_path / "link", tmp_path / "hard"):
        if planted.name == "link":
            planted.symlink_to(victim)
        else:
            os.link(victim, planted)
        with pytest.raises(FileExistsError):
            write_new(planted, b"overwritten")
    assert victim.read_text() == "precious"


def test_replace_durably_replaces_a_link_not_what_it_points_to(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    final = tmp_path / "final"
    final.symlink_to(victim)
    replace_durably(final, b"new")
    assert not final.is_symlink() and final.read_bytes() == b"new"
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(final.stat().st_mode) == 0o644 & ~current_umask()


def test_a_failed_replace_leaves_no_temporary_file(tmp_path: Path):
    (tmp_path / "final").mkdir()  # a rename of a file over a folder fails
    with pytest.raises(OSError) as failed:
        replace_durably(tmp_path / "final", b"new")
    assert failed.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert [p.name for p in tmp_path.iterdir()] == ["final"]


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
