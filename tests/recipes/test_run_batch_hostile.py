"""`batchscore run-batch` against hostile request files and command lines: every bad line is
its own error line with a documented code, the good lines are served, nothing is a traceback,
and the request file is never written over."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.commands import invoke

EMBED_MODEL = "all-MiniLM-L6-v2"
FP32 = ("--set", "model.precision=fp32")


def request(custom_id: object, url: str = "/v1/embeddings", **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run_batch(source: Path, target: Path | str, *extra: str, model: str = EMBED_MODEL):
    return invoke("run-batch", "-i", str(source), "-o", str(target), "--model", model, *extra)


@pytest.mark.parametrize("spelling", ["same", "dotdot", "symlink", "hardlink", "file-url"])
def test_the_results_never_overwrite_the_request_file(tmp_path: Path, spelling: str):
    """``-o`` naming the request file itself (as written, spelled another way or as a file://
    URL, a link to it, or a hard link) is refused before anything is read or written: exit 2,
    naming both."""
    source = tmp_path / "requests.jsonl"
    source.write_text(request("a", input="kept as it is") + "\n")
    before = source.read_bytes()
    (tmp_path / "x").mkdir()
    target: Path | str = {
        "same": source,
        "dotdot": tmp_path / "x" / ".." / "requests.jsonl",
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
        "file-url": f"file://{source}",
    }[spelling]
    if spelling == "symlink":
        target.symlink_to(source)
    if spelling == "hardlink":
        os.link(source, target)
    done = run_batch(source, target, *FP32)
    assert done.exit_code == 2, done.output
    assert str(source) in done.output and str(target) in done.output
    assert "Traceback" not in done.output
    assert source.read_bytes() == before
    assert not Path(f"{target}.work").exists()


def test_a_work_folder_that_cannot_be_one_is_a_clear_error(tmp_path: Path):
    """``--work-dir`` naming a file (the request file, say) is refused before anything is
    read (exit 2); a folder that cannot be made under it is a write error (exit 6), never a
    traceback, and the request file is as it was."""
    source = tmp_path / "requests.jsonl"
    source.write_text(request("a", input="a text") + "\n")
    before = source.read_bytes()
    target = tmp_path / "results.jsonl"
    done = run_batch(source, target, *FP32, "--work-dir", str(source))
    assert done.exit_code == 2, done.output
    assert f"--work-dir {source}: is a file" in done.output
    (tmp_path / "plain").write_text("")
    under = run_batch(source, target, *FP32, "--work-dir", str(tmp_path / "plain" / "work"))
    assert under.exit_code == 6, under.output
    assert "Traceback" not in under.output + done.output and source.read_bytes() == before
    assert not target.exists()


CUT = "cut \ud83d emoji"  # half an emoji, as JavaScript and Java write a string cut there


def test_every_hostile_line_is_its_own_error_line(tmp_path: Path):
    """One file holding what producers really send: a BOM, a line that is not UTF-8, blank
    lines, JSON that is no object, empty and blank inputs, a very long input, nulls, lone
    surrogates (in a text and in a custom_id), nesting past the parser's depth, and
    custom_ids used twice (after a served line and after a refused one). Each non-blank line
    has one result line in its place, the good ones served; exit 0; the results file is
    UTF-8 whose lines all parse, and a custom_id comes back as it was sent."""
    lines = [
        b"\xef\xbb\xbf" + request("good", input="a fine text").encode(),
        request("latin1", input="caf__").encode().replace(b"__", b"\xe9"),
        b"",
        b"   ",
        b"[1, 2]",
        b"42",
        request("empty", input="").encode(),
        request("blank", input="   ").encode(),
        request("long", input="word " * 5000).encode(),
        request("empty", input="served on a later line?").encode(),
        request("good", input="and again?").encode(),
        request(None, input="no custom_id").encode(),
        request("nulls", input="x", dimensions=None, encoding_format=None, model=None).encode(),
        request("null-input", input=None).encode(),
        request("surrogate", input=CUT).encode(),
        request(CUT, input="a custom_id cut in half").encode(),
        b"[" * 100_000,
        request("last", input=["one", "two"]).encode(),
    ]
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    done = run_batch(source, target, *FP32)
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    results = [json.loads(text) for text in target.read_bytes().decode("utf-8").splitlines()]
    expected = [
        ("good", None),
        ("latin1", "invalid_unicode"),
        (None, "invalid_request"),
        (None, "invalid_request"),
        ("empty", "invalid_request"),
        ("blank", "invalid_request"),
        ("long", None),
        ("empty", "duplicate_custom_id"),
        ("good", "duplicate_custom_id"),
        (None, "invalid_request"),
        ("nulls", None),
        ("null-input", "invalid_request"),
        ("surrogate", "invalid_unicode"),
        (CUT, "invalid_unicode"),
        (None, "invalid_json"),
        ("last", None),
    ]
    got = [(line["custom_id"], line["error"] and line["error"]["code"]) for line in results]
    assert got == expected
    for line, (_, code) in zip(results, expected, strict=True):
        assert line["response"]["status_code"] == (200 if code is None else 400)
    long_usage = results[6]["response"]["body"]["usage"]["prompt_tokens"]
    assert 0 < long_usage <= 512  # truncated to the model's window, counted as it read it
    assert len(results[15]["response"]["body"]["data"]) == 2


def test_advice_names_what_run_batch_takes(tmp_path: Path):
    """Every remedy a run-batch message gives is one run-batch accepts: a changed setting
    names the job's work folder to remove and --work-dir (run-batch has no --restart), and
    following that advice works; a model it cannot find is named as --model."""
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text(request("a", input="a text") + "\n")
    assert run_batch(source, target, *FP32).exit_code == 0
    changed = run_batch(source, target, *FP32, "--set", "model.max_length=64")
    assert changed.exit_code == 5, changed.output
    assert "--restart" not in changed.output and "[output].path" not in changed.output
    folder = tmp_path / "results.jsonl.work" / "embeddings"
    assert f"remove {folder}" in changed.output and "--work-dir" in changed.output
    shutil.rmtree(folder)
    again = run_batch(source, target, *FP32, "--set", "model.max_length=64")
    assert again.exit_code == 0, again.output
    unknown = run_batch(source, tmp_path / "other.jsonl", model="no-such-model")
    assert unknown.exit_code == 4, unknown.output
    assert "[model]" not in unknown.output and "--model" in unknown.output
