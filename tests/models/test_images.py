"""embed with two-tower models (CLIP, SigLIP): image vectors equal to the model's own
``get_image_features`` on its own processor's pixels, texts through the text tower into the
same space, and every unreadable image a row error with its reason.

The models are tiny, of random weights, built from configs in temporary folders
(scripts/images_example.py's CLIP; a SigLIP and a sentence-transformers CLIP folder here), so
nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from images_example import clip_tokenizer, images, picture, tiny_clip  # scripts/, on the path
from PIL import Image

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output, write_job


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def siglip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random SigLIP (the CLIP example's byte tokenizer beside it), 32x32 images in patches
    of 8, texts padded to its 16 positions."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    folder = tmp_path_factory.mktemp("siglip")
    vocab = clip_tokenizer(folder)
    tower = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2}
    config = SiglipConfig(
        text_config={**tower, "num_attention_heads": 2, "vocab_size": vocab,
                     "max_position_embeddings": 16, "pad_token_id": vocab - 1},
        vision_config={**tower, "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
    )  # fmt: skip
    torch.manual_seed(1)
    SiglipModel(config).eval().save_pretrained(folder)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def st_clip_path(clip_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sentence-transformers' CLIP layout: the model in 0_CLIPModel/, then Normalize."""
    folder = tmp_path_factory.mktemp("st-clip")
    shutil.copytree(clip_path, folder / "0_CLIPModel")
    modules = [
        {"idx": 0, "name": "0", "path": "0_CLIPModel",
         "type": "sentence_transformers.models.CLIPModel"},
        {"idx": 1, "name": "1", "path": "1_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Normalize").mkdir()
    return folder


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards: 12 pictures as bytes, 12 as files named relative to their shard."""
    folder = tmp_path_factory.mktemp("pictures")
    images(folder, rows=24)
    return folder


def reference(path: Path, data: list[bytes]) -> np.ndarray:
    """The model's own vectors: ``get_image_features`` on its own processor's pixels."""
    from transformers import AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(path).eval()
    processor = AutoImageProcessor.from_pretrained(path)
    opened = [Image.open(io.BytesIO(d)).convert("RGB") for d in data]
    with torch.no_grad():
        out = model.get_image_features(**processor(images=opened, return_tensors="pt"))
    return getattr(out, "pooler_output", out).numpy()


def all_pictures(folder: Path) -> list[bytes]:
    """Every picture of the fixture's shards, in row order."""
    values = []
    for shard in sorted(folder.glob("*.parquet")):
        for value in pq.read_table(shard).column("image").to_pylist():
            values.append(value if isinstance(value, bytes) else (folder / value).read_bytes())
    return values


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    return (a * (b / np.linalg.norm(b, axis=1, keepdims=True))).sum(axis=1)


def embed_job(tmp_path: Path, weights: Path, data: Path, **extra) -> Path:
    inp = {
        "path": str(data / "*.parquet"),
        "image": "image",
        "id": "image_id",
        **extra.pop("input", {}),
    }
    inp = {key: value for key, value in inp.items() if value is not None}
    return write_job(
        tmp_path / "job.toml",
        input=inp,
        model={"task": "embed", "path": str(weights), **extra.pop("model", {})},
        output={"path": str(tmp_path / "out"), **extra.pop("output", {})},
        **extra,
    )


@pytest.mark.parametrize("which", ["clip_path", "siglip_path", "st_clip_path"])
def test_image_vectors_are_the_models_own(which, request, tmp_path: Path, pictures: Path):
    """Bytes and relative paths alike: cosine >= 0.9999 with get_image_features (fp32), one
    row per picture in input order, normalized as the job asks, in small batches."""
    path = request.getfixturevalue(which)
    job = embed_job(tmp_path, path, pictures, batching={"max_rows": 5})
    run_job(load_job(job))
    out = read_output(tmp_path / "out")
    assert out.column("image_id").to_pylist() == list(range(24))
    got = np.array(out.column("embedding").to_pylist(), dtype=np.float32)
    folder = path / "0_CLIPModel" if which == "st_clip_path" else path
    want = reference(folder, all_pictures(pictures))
    assert got.shape == want.shape
    assert cosines(got, want).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("which", ["clip_path", "siglip_path"])
def test_usage_counts_the_patches_the_model_saw(which, request, tmp_path: Path, pictures: Path):
    """`[output].usage` for images: each row's count is the vision tower's positions (its
    patches, and CLIP's class token), as the model's own embeddings layer holds them; the
    run's total is their sum."""
    from transformers import AutoModel

    path = request.getfixturevalue(which)
    job = embed_job(tmp_path, path, pictures, output={"usage": True})
    report = run_job(load_job(job))
    seen = AutoModel.from_pretrained(path).vision_model.embeddings.num_positions
    counts = read_output(tmp_path / "out").column("prompt_tokens").to_pylist()
    assert counts == [seen] * 24
    assert report["prompt_tokens"] == 24 * seen


@pytest.mark.parametrize("which", ["clip_path", "siglip_path"])
def test_texts_through_the_text_tower(which, request, tmp_path: Path, pictures: Path):
    """The same model, a text column: get_text_features on its tokenizer's ids, padded as its
    processor pads them (SigLIP's to all its positions), so captions and pictures share one
    space."""
    from transformers import AutoModel, AutoTokenizer

    path = request.getfixturevalue(which)
    job = embed_job(tmp_path, path, pictures, input={"image": None, "text": "caption"})
    run_job(load_job(job))
    out = read_output(tmp_path / "out")
    got = np.array(out.column("embedding").to_pylist(), dtype=np.float32)
    shards = sorted(pictures.glob("*.parquet"))
    captions = [c for s in shards for c in pq.read_table(s).column("caption").to_pylist()]
    model = AutoModel.from_pretrained(path).eval()
    padding = "max_length" if which == "siglip_path" else True
    tokens = AutoTokenizer.from_pretrained(path)(
        captions, padding=padding, max_length=16 if which == "siglip_path" else None,
        return_tensors="pt",
    )  # fmt: skip
    if which == "siglip_path":
        tokens.pop("attention_mask")  # SigLIP was trained on padded ids, no mask
    with torch.no_grad():
        want = model.get_text_features(**tokens)
    want = getattr(want, "pooler_output", want).numpy()
    assert cosines(got, want).min() >= 0.9999


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels in a few dozen bytes: what a
    decompression bomb looks like before it is decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def bad_shard(folder: Path) -> tuple[Path, bytes]:
    """One shard of good and bad images (a good one first and last), and the good picture."""
    good = picture("disc", "red", np.random.default_rng(3))
    values = [
        good,
        b"not an image at all",
        good[: len(good) // 2],  # truncated
        png_header(50_000, 50_000),  # past twice Pillow's limit: refused when opened
        png_header(10_000, 10_000),  # past the limit, under twice it: refused by the check
        None,
        b"",
        good,
    ]
    folder.mkdir()
    pq.write_table(
        pa.table({"image_id": list(range(len(values))), "image": pa.array(values, pa.binary())}),
        folder / "part-0.parquet",
    )
    paths = pa.table({"image_id": [10, 11], "image": ["missing.png", "/no/such/image.png"]})
    pq.write_table(paths, folder / "part-1.parquet")
    return folder, good


def test_bad_images_are_row_errors_with_reasons(tmp_path: Path, clip_path: Path):
    """Corrupt, truncated, a decompression bomb (refused from its header, per row), null,
    empty, missing files: each its row's error with the reason, the good rows scored."""
    data, good = bad_shard(tmp_path / "in")
    job = embed_job(tmp_path, clip_path, data, output={"on_error": "skip", "max_bad_share": 1.0})
    run_job(load_job(job))
    out = read_output(tmp_path / "out")
    errors = dict(
        zip(out.column("image_id").to_pylist(), out.column("error").to_pylist(), strict=True)
    )
    assert errors[0] is None and errors[7] is None
    assert "not an image in a format read here (PNG, JPEG" in errors[1]
    assert "cannot decode the image" in errors[2] and "truncated" in errors[2]
    assert "decompression bomb" in errors[3]
    assert "10000x10000 pixels" in errors[4] and "decompression bomb" in errors[4]
    assert "no image" in errors[5] and "no image" in errors[6]
    assert "missing.png: no such file" in errors[10] and str(data) in errors[10]
    assert "/no/such/image.png: no such file" in errors[11]
    assert all(errors[r].startswith("column 'image': ") for r in (1, 2, 3, 4, 5, 6, 10, 11))
    vectors = out.column("embedding").to_pylist()
    assert [v is None for v in vectors] == [e is not None for e in errors.values()]
    want = reference(clip_path, [good])
    assert cosines(np.array([vectors[0], vectors[7]], np.float32), np.repeat(want, 2, 0)).min() > (
        0.9999
    )


def test_pillows_pixel_limit_is_read_per_row(tmp_path: Path, clip_path: Path, monkeypatch):
    """Image.MAX_IMAGE_PIXELS, as the caller sets it, refuses larger pictures per row."""
    data, _ = bad_shard(tmp_path / "in")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # the good disc is larger than this
    job = embed_job(tmp_path, clip_path, data, output={"on_error": "skip", "max_bad_share": 1.0})
    run_job(load_job(job))
    errors = read_output(tmp_path / "out").column("error").to_pylist()
    assert "decompression bomb" in errors[0] and "decompression bomb" in errors[7]


def test_a_bad_image_fails_its_shard_alone_by_default(tmp_path: Path, clip_path: Path):
    """on_error = "fail": the shard with the corrupt image fails, naming its row and reason;
    a clear message and exit status, never a traceback."""
    data, _ = bad_shard(tmp_path / "in")
    result = invoke("run", str(embed_job(tmp_path, clip_path, data)), "--progress", "off")
    assert result.exit_code not in (0, 1), result.stderr
    assert (
        "part-0.parquet" in result.stderr and "not an image in a format read here" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_datasets_image_struct(tmp_path: Path, clip_path: Path, pictures: Path):
    """Hugging Face datasets' Image column: a struct of bytes (embedded) or a path."""
    good = picture("square", "blue", np.random.default_rng(5))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "pic.png").write_bytes(good)
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    column = pa.array([{"bytes": good, "path": None}, {"bytes": None, "path": "pic.png"}], kind)
    pq.write_table(pa.table({"image_id": [0, 1], "image": column}), tmp_path / "in" / "a.parquet")
    run_job(load_job(embed_job(tmp_path, clip_path, tmp_path / "in")))
    got = np.array(read_output(tmp_path / "out").column("embedding").to_pylist(), np.float32)
    assert cosines(got, np.repeat(reference(clip_path, [good]), 2, 0)).min() >= 0.9999


def test_windows_hold_the_pixel_budget(clip_path: Path, monkeypatch):
    """The reader's windows are cut to the images whose pixels fit the budget; batches to the
    job's image count (max_rows) and positions (max_tokens: 17 per image here)."""
    from batchscore.job.sections import BatchingConfig, EmbedConfig, InputConfig, ModelConfig
    from batchscore.models import images as module
    from batchscore.pipeline.batching import Batching
    from batchscore.pipeline.stages import window_rows

    monkeypatch.setattr(module, "WINDOW_PIXEL_BYTES", 5 * 3 * 32 * 32 * 4)
    model = ModelConfig(task="embed", path=str(clip_path), precision="fp32")
    inp = InputConfig(path=(), image="image")
    encoding = module.TowersEncoding(clip_path, model=model, options=EmbedConfig(), inp=inp)
    assert window_rows(encoding, BatchingConfig(window_rows=100)) == 5
    good = picture("disc", "red", np.random.default_rng(0))
    encoded = encoding.encode(pa.table({"image": pa.array([good] * 9, pa.binary())}))
    assert encoded.extra["pixels"].shape == (9, 3, 32, 32) and set(encoded.lengths) == {17}
    policy = Batching.of(BatchingConfig(max_tokens=17 * 4, max_rows=3), encoding)
    assert not policy.sort  # every image is as long as the next: nothing to sort
    cut = policy.batches(encoded, np.arange(9))
    assert [len(b) for b in cut] == [3, 3, 3]


def test_job_errors(tmp_path: Path, clip_path: Path, pictures: Path, minilm_path: Path):
    """[input].image needs task embed and a two-tower model; a single encoder's [embed] keys
    are refused for one: exit 2, the key named."""
    job = embed_job(tmp_path, clip_path, pictures, model={"task": "classify"})
    result = invoke("validate", str(job))
    assert result.exit_code == 2 and "[input].image: task embed reads images" in result.stderr
    job = embed_job(tmp_path, minilm_path, pictures)
    result = invoke("validate", str(job))
    assert result.exit_code != 0 and "needs a CLIP or SigLIP model" in result.stderr
    job = embed_job(tmp_path, clip_path, pictures, embed={"truncate_dim": 8})
    result = invoke("validate", str(job))
    assert result.exit_code == 2 and "[embed].truncate_dim: not for CLIP models" in result.stderr
    job = embed_job(tmp_path, clip_path, pictures, input={"image": None, "text": "caption"})
    result = invoke("validate", str(job), "--set", "model.max_length=100")
    assert result.exit_code != 0 and "more than the 77 positions" in result.stderr
    with pytest.raises(JobError, match="long_text"):
        load_job(embed_job(tmp_path, clip_path, pictures, model={"long_text": "chunk"}))


def sample_files() -> list[bytes]:
    """One picture in each of the formats image datasets hold."""
    image = Image.open(io.BytesIO(picture("stripe", "green", np.random.default_rng(7))))
    out = []
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"):
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        out.append(buffer.getvalue())
    return out


FILES = sample_files()


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A real image file with some bytes changed, cut short, or both; or any bytes at all."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=256))
    data = bytearray(draw(st.sampled_from(FILES)))
    for _ in range(draw(st.integers(0, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


@pytest.fixture(scope="module")
def clip_pictures(clip_path: Path):
    from batchscore.models.vision.pictures import Pictures

    return Pictures(clip_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(damaged(), min_size=1, max_size=4))
def test_any_bytes_are_pixels_or_a_row_error(clip_pictures, values):
    """Whatever the bytes, each row is pixels of the model's shape or an error with its reason:
    the window never fails, and rows and errors cover every row once."""
    pixels, rows, errors = clip_pictures.pixels(
        pa.table({"image": pa.array(values, pa.binary())}), "image"
    )
    assert sorted([*rows.tolist(), *errors]) == list(range(len(values)))
    assert pixels.shape[0] == len(rows) and (not len(rows) or pixels.shape[1:] == (3, 32, 32))
    assert np.isfinite(pixels).all()
    assert all(message.startswith("column 'image': ") for message in errors.values())


def test_the_gate_samples_bytes_and_paths_alike(tmp_path: Path, clip_pictures, pictures: Path):
    """The quality gate's sample joins a shard of bytes and a shard of relative paths without
    turning the paths into bytes (Arrow's own join would), and its results are taken, by their
    pixels, instead of scoring the same images again."""
    from batchscore.job.sections import InputConfig
    from batchscore.pipeline.stages import sample_rows
    from batchscore.work.shards import find_shards

    inp = InputConfig(path=(str(pictures / "*.parquet"),), image="image")
    sample = sample_rows(inp, {"image": "image"}, find_shards(inp), 24)
    assert sample.num_rows == 24
    _, rows, errors = clip_pictures.pixels(sample, "image")
    assert not errors and len(rows) == 24


def test_repeats_and_the_gates_rows_are_scored_once(tmp_path: Path, clip_path, pictures: Path):
    job = embed_job(tmp_path, clip_path, pictures, model={"precision": "auto"})
    result = invoke("run", str(job), "--progress", "off")
    assert result.exit_code == 0, result.stderr
    assert "24 inputs scored by its pass, not again" in result.output


def test_files_named_by_rows(tmp_path: Path, clip_pictures):
    """A link to a picture is read (a dataset's pictures may be links into a cache); a FIFO is
    a row error, not a reader hung on it; EPS is never opened (Pillow would run Ghostscript on
    it)."""
    import os

    good = picture("disc", "blue", np.random.default_rng(9))
    (tmp_path / "real.png").write_bytes(good)
    (tmp_path / "link.png").symlink_to(tmp_path / "real.png")
    os.mkfifo(tmp_path / "pipe.png")
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    table = pa.table({"image": pa.array(["link.png", "pipe.png", "real.png"])})
    table = table.append_column("_batchscore_folder", pa.array([str(tmp_path)] * 3))
    _, rows, errors = clip_pictures.pixels(table, "image")
    assert rows.tolist() == [0, 2] and "not a regular file" in errors[1]
    _, rows, errors = clip_pictures.pixels(
        pa.table({"image": pa.array([eps], pa.binary())}), "image"
    )
    assert not len(rows) and "not an image in a format read here" in errors[0]


def test_pictures_in_an_object_store(bucket: str, tmp_path: Path, clip_path: Path):
    """A shard in S3 naming its pictures by relative path, and one by full URI: each read from
    the store, beside the shard, and equal to the model's own vectors."""
    import pyarrow.fs as pafs

    good = picture("disc", "green", np.random.default_rng(11))
    (tmp_path / "pic.png").write_bytes(good)
    pafs.copy_files(str(tmp_path / "pic.png"), f"{bucket}/in/pics/pic.png")
    values = ["pics/pic.png", f"{bucket}/in/pics/pic.png", "pics/gone.png"]
    pq.write_table(pa.table({"image_id": [0, 1, 2], "image": values}), tmp_path / "s.parquet")
    pafs.copy_files(str(tmp_path / "s.parquet"), f"{bucket}/in/s.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": f"{bucket}/in/s.parquet", "image": "image", "id": "image_id"},
        model={"task": "embed", "path": str(clip_path)},
        output={"path": str(tmp_path / "out"), "on_error": "skip", "max_bad_share": 1.0},
    )
    run_job(load_job(job))
    out = read_output(tmp_path / "out")
    errors = out.column("error").to_pylist()
    assert errors[:2] == [None, None] and "gone.png" in errors[2]
    got = np.array(out.column("embedding").to_pylist()[:2], np.float32)
    assert cosines(got, np.repeat(reference(clip_path, [good]), 2, 0)).min() >= 0.9999


def test_without_pillow_an_image_job_names_the_extra(clip_path: Path, monkeypatch):
    """Pillow is the `images` extra's: where it is missing (faked here by hiding the module,
    as uninstalling it from the test environment is not an option) the encoding stops with
    the extra's install line, before any row."""
    import sys

    from batchscore.models.vision.pictures import Pictures

    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(JobError, match=r"batchscore\[images\]"):
        Pictures(clip_path)
