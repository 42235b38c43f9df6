"""An object-store output's local folder (its lock and staged files, under the shared temp
folder) is made private, and one that another user made or can write is refused, untouched.
Tests run as root, so "another user" is a folder handed to another uid with `os.chown`."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from batchscore.errors import WriteError
from batchscore.output.lock import hold_lock
from batchscore.storage.objects import ObjectStore, local_folder
from batchscore.storage.private import private_root
from batchscore.storage.retry import Retry

OTHER_UID = 54321
URL = "s3://bucket/out"


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp folder of the test's own, as ``TMPDIR`` would name one."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)  # as /tmp is: everyone may create in it
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def store() -> ObjectStore:
    """An object store's output (nothing is asked of the bucket by what is tested here)."""
    return ObjectStore(URL, pafs.LocalFileSystem(), "bucket/out", Retry())


def test_the_folder_is_made_private_and_the_lock_goes_in_it(temp: Path):
    out = store()
    out.check()
    out.prepare()
    for folder in (private_root(), local_folder(URL), out.staging):
        info = os.lstat(folder)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == os.geteuid()
    assert private_root().parent == temp and out.lock_path.parent == local_folder(URL)
    with hold_lock(out.lock_path, "job", URL):
        assert out.lock_path.is_file()


def hand_over(folder: Path) -> None:
    os.chown(folder, OTHER_UID, -1)


def open_up(folder: Path) -> None:
    folder.chmod(0o777)


def swap_for_link(folder: Path) -> None:
    target = folder.with_name(folder.name + "-real")
    folder.rename(target)
    folder.symlink_to(target)


@pytest.mark.parametrize(
    ("level", "change", "said"),
    [
        ("root", hand_over, f"belongs to another user \\(uid {OTHER_UID}\\)"),
        ("output", hand_over, f"belongs to another user \\(uid {OTHER_UID}\\)"),
        ("root", open_up, r"is writable by other users \(mode drwxrwxrwx\)"),
        ("output", open_up, r"is writable by other users"),
        ("root", swap_for_link, "is a symbolic link"),
        ("output", swap_for_link, "is a symbolic link"),
    ],
)
def test_a_folder_another_user_could_plant_in_is_refused_untouched(temp, level, change, said):
    first = store()
    first.check()
    folder = private_root() if level == "root" else local_folder(URL)
    change(folder)
    planted = local_folder(URL) / "lock"
    planted.symlink_to(temp / "victim")  # what its owner could have put there
    before = sorted(os.listdir(local_folder(URL)))
    with pytest.raises(WriteError, match=rf"{folder}: {said}.*point TMPDIR at a folder"):
        store().check()
    with pytest.raises(WriteError):
        store().prepare()
    assert sorted(os.listdir(local_folder(URL))) == before  # nothing made, nothing removed
    assert not (temp / "victim").exists()


def test_a_file_where_the_folder_goes_is_refused(temp: Path):
    private_root().mkdir(mode=0o700)
    local_folder(URL).write_text("not a folder")
    with pytest.raises(WriteError, match=rf"{local_folder(URL)}: is not a folder"):
        store().check()
    assert local_folder(URL).read_text() == "not a folder"
