"""A symbolic link inside the output folder is never followed to write, rename or delete: a link
where `_batchscore`, one of its folders, a data file, `_SUCCESS` or a temporary file goes stops
the run (exit 6) naming the link, and whatever it points to is left exactly as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from batchscore.errors import WriteError
from batchscore.job.load import load_job
from batchscore.recipes.driver import run_job
from batchscore.storage.local import LocalStore
from tests.commands import invoke
from tests.output.tiny import tiny_job, write_shard

FOLDERS = ["_batchscore", *(f"_batchscore/{f}" for f in ("tmp", "done", "writing", "runs"))]
FOLDERS += ["_batchscore/rejected", "_batchscore/gone"]
FILES = ["_SUCCESS", "_batchscore/lock", "_batchscore/job.json", "data file", "tmp file"]


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (links not followed), with the digest of its bytes."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def plant(out: Path, place: str, elsewhere: Path) -> Path:
    """Replace ``place`` in ``out`` with a link to a copy of it (plus a file of someone else's)
    in ``elsewhere``; return the link."""
    if place == "data file":
        place = next(p.name for p in out.glob("part-*.parquet"))
    if place == "tmp file":
        place = "_batchscore/tmp/part-0123456789abcdef-00000.parquet.4242.tmp"
    link = out / place
    target = elsewhere / link.name
    if link.is_dir():
        shutil.move(link, target)
        (target / "someone-elses.txt").write_text("not batchscore's\n")
    elif link.exists():
        shutil.move(link, target)
    else:
        target.write_text("not batchscore's\n")
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


@pytest.mark.parametrize("place", FOLDERS + FILES)
def test_a_link_in_the_output_folder_stops_the_run_and_its_target_is_untouched(
    tmp_path: Path, place: str
):
    job = tiny_job(tmp_path)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in "abc":
        write_shard(tmp_path / f"in/{name}.parquet", 5, seed=ord(name))
    run_job(load_job(job))
    link = plant(out, place, elsewhere)
    before = tree(elsewhere)
    (tmp_path / "in/a.parquet").unlink()  # work for every place: a shard to move out, one to
    write_shard(tmp_path / "in/d.parquet", 5)  # score; the tmp clean-up at the start

    result = invoke("run", str(job), "--progress", "off")

    assert result.exit_code == 6, result.output
    assert f"{link}: is a symbolic link" in result.stderr
    assert tree(elsewhere) == before and link.is_symlink()


OPERATIONS = {
    "write_json": lambda s: s.write_json("_batchscore/done/k.json", {"x": 1}),
    "write_text": lambda s: s.write_text("_batchscore/done/k.json", "x"),
    "write_many": lambda s: s.write_many({"_batchscore/done/k.json": {"x": 1}}),
    "delete": lambda s: s.delete("_batchscore/done/k.json"),
    "move out": lambda s: s.move("_batchscore/done/k.json", "_batchscore/gone/r/k.json"),
    "move in": lambda s: s.move("part-0.parquet", "_batchscore/done/k.json"),
    "prepare": lambda s: s.prepare("_batchscore/done"),
    "barrier": lambda s: s.barrier("_batchscore/done"),
    "publish": lambda s: s.publish(s.staging / "x.tmp", "_batchscore/done/k.json"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("where", ["folder", "file"])
def test_every_store_write_refuses_a_link_on_its_way(tmp_path: Path, operation: str, where: str):
    """Checked at each operation too, not only at a run's start: a link planted mid-run."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    store = LocalStore(out)
    store.prepare("_batchscore/done")
    (store.staging / "x.tmp").write_text("staged")
    (out / "part-0.parquet").write_text("a user's")
    elsewhere.mkdir()
    (elsewhere / "k.json").write_text("not batchscore's\n")
    link = out / "_batchscore/done"
    if where == "folder":
        link.rmdir()
        link.symlink_to(elsewhere, target_is_directory=True)
    else:
        link = link / "k.json"
        link.symlink_to(elsewhere / "k.json")
    before = tree(elsewhere)
    if operation in ("prepare", "barrier") and where == "file":
        OPERATIONS[operation](store)  # the folder is real: nothing is written through the link
    else:
        with pytest.raises(WriteError, match=f"{link}: is a symbolic link"):
            OPERATIONS[operation](store)
    assert tree(elsewhere) == before and link.is_symlink()
