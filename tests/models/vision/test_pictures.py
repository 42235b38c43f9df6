"""Images opened as transformers' own loader opens them (`transformers.image_utils.load_image`:
turned upright by their EXIF orientation, then made RGB), and an image that cannot be read, by
whatever route, its row's error.

Real JPEG, PNG, GIF and WebP files written by Pillow, and the tiny random CLIP of
scripts/images_example.py, built in a temporary folder: nothing is downloaded.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from images_example import picture, tiny_clip  # scripts/, on the path
from PIL import Image
from transformers.image_utils import load_image

import batchscore
from batchscore.job.parse import load_job
from batchscore.models.vision.pictures import Pictures
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output, write_job

ORIENTATION = 0x0112  # the EXIF tag a camera writes instead of turning its pixels
# what turns an upright picture into the pixels a camera stores with each orientation: the
# inverse of the turn `PIL.ImageOps.exif_transpose` makes when the picture is shown
STORED = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def clip_pictures(clip_path: Path) -> Pictures:
    return Pictures(clip_path)


def upright() -> Image.Image:
    """A picture wider than tall, whose every turn and mirror differs: blue along the top,
    red down the left, a green block bottom right."""
    pixels = np.full((32, 48, 3), 240, np.uint8)
    pixels[:, :16] = (220, 30, 30)
    pixels[:8] = (40, 60, 220)
    pixels[20:, 30:] = (30, 180, 60)
    return Image.fromarray(pixels)


def photo(orientation: int) -> bytes:
    """The upright picture as a phone stores it: a JPEG of the pixels as the sensor read them,
    and the EXIF orientation that turns them upright (quality 100, no chroma subsampling, so
    the turn is all that differs)."""
    turn = STORED[orientation]
    stored = upright() if turn is None else upright().transpose(turn)
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    out = io.BytesIO()
    stored.save(out, format="JPEG", quality=100, subsampling=0, exif=exif)
    return out.getvalue()


def transformers_pixels(clip_path: Path, path: Path) -> np.ndarray:
    """The model's processor on transformers' own loader's image of the file at ``path``."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(clip_path)
    return processor(images=[load_image(str(path))], return_tensors="np")["pixel_values"][0]


def our_pixels(pictures: Pictures, values: list, folder: Path | None = None) -> np.ndarray:
    """`Pictures.pixels` of one column of ``values`` (paths relative to ``folder``): every row
    must read."""
    table = pa.table({"image": values})
    if folder is not None:
        table = table.append_column("_batchscore_folder", pa.array([str(folder)] * len(values)))
    pixels, rows, errors = pictures.pixels(table, "image")
    assert not errors and rows.tolist() == list(range(len(values)))
    return pixels


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_photos_are_turned_upright_by_their_exif_orientation(
    orientation: int, tmp_path: Path, clip_path: Path, clip_pictures: Pictures
):
    """Every EXIF orientation, as bytes and as a file: the very pixels transformers' loader
    gives, and those of the upright picture (within JPEG's rounding), never those stored."""
    data = photo(orientation)
    (tmp_path / "photo.jpg").write_bytes(data)
    want = transformers_pixels(clip_path, tmp_path / "photo.jpg")
    got = our_pixels(clip_pictures, [data])
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(our_pixels(clip_pictures, ["photo.jpg"], tmp_path)[0], want)
    buffer = io.BytesIO()
    upright().save(buffer, format="PNG")
    shown = our_pixels(clip_pictures, [buffer.getvalue()])[0]
    assert np.abs(got[0] - shown).max() < 0.1  # the processor's units: a few levels of 255


def reference(clip_path: Path, images: list[Image.Image]) -> np.ndarray:
    """The model's own ``get_image_features`` on its processor's pixels of ``images``."""
    from transformers import AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(clip_path).eval()
    processor = AutoImageProcessor.from_pretrained(clip_path)
    with torch.no_grad():
        out = model.get_image_features(**processor(images=images, return_tensors="pt"))
    return getattr(out, "pooler_output", out).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    return (a * (b / np.linalg.norm(b, axis=1, keepdims=True))).sum(axis=1)


def test_a_job_and_score_embed_phone_photos_upright(tmp_path: Path, clip_path: Path):
    """A job over a shard of photos in every orientation, and `batchscore.score` over the same
    rows: each vector is the model's own on transformers' loader's image (cosine >= 0.9999),
    so the upright picture's."""
    photos = [photo(o) for o in sorted(STORED)]
    (tmp_path / "in").mkdir()
    table = pa.table({"image_id": list(range(8)), "image": pa.array(photos, pa.binary())})
    pq.write_table(table, tmp_path / "in" / "photos.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "image": "image", "id": "image_id"},
        model={"task": "embed", "path": str(clip_path)},
        output={"path": "out"},
    )
    run_job(load_job(job))
    ran = np.array(read_output(tmp_path / "out").column("embedding").to_pylist(), np.float32)
    scored = batchscore.score(table, task="embed", model=clip_path, image="image")
    from_memory = np.array(scored.column("embedding").to_pylist(), np.float32)
    loaded = [load_image(Image.open(io.BytesIO(p))) for p in photos]
    want = reference(clip_path, loaded)
    assert cosines(ran, want).min() >= 0.9999 and cosines(from_memory, want).min() >= 0.9999
    shown = np.repeat(reference(clip_path, [upright()]), 8, axis=0)
    assert cosines(ran, shown).min() >= 0.999


def saved(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def modes() -> dict[str, bytes]:
    """Files of every kind of pixel a dataset holds beside plain RGB."""
    rgb = Image.open(io.BytesIO(picture("disc", "red", np.random.default_rng(4)))).convert("RGB")
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    see_through = palette.copy()
    see_through.info["transparency"] = 0
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgb.size))
    deep = Image.fromarray((np.asarray(rgb.convert("L"), np.uint16) * 257).astype(np.uint16))
    frames = [rgb, rgb.rotate(90), rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    return {
        "palette PNG": saved(palette, "PNG"),
        "palette PNG with a transparent colour": saved(see_through, "PNG", transparency=0),
        "RGBA PNG, transparent to opaque": saved(rgba, "PNG"),
        "LA PNG": saved(rgba.convert("LA"), "PNG"),
        "grey PNG": saved(rgb.convert("L"), "PNG"),
        "1-bit PNG": saved(rgb.convert("1"), "PNG"),
        "16-bit grey PNG": saved(deep, "PNG"),
        "CMYK JPEG": saved(rgb.convert("CMYK"), "JPEG", quality=95),
        "CMYK TIFF": saved(rgb.convert("CMYK"), "TIFF"),
        "animated GIF": saved(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "animated WebP": saved(frames[0], "WEBP", save_all=True, append_images=frames[1:]),
    }


@pytest.mark.parametrize("kind", list(modes()))
def test_every_pixel_mode_as_transformers_loads_it(
    kind: str, tmp_path: Path, clip_path: Path, clip_pictures: Pictures
):
    """Palette, transparency, grey, 1-bit, 16-bit, CMYK: made RGB as transformers' loader makes
    them; an animated GIF or WebP read by its first frame, as there. The very same pixels."""
    data = modes()[kind]
    (tmp_path / "file").write_bytes(data)
    want = transformers_pixels(clip_path, tmp_path / "file")
    np.testing.assert_array_equal(our_pixels(clip_pictures, [data])[0], want)


def test_a_truncated_photo_is_its_rows_error(tmp_path: Path, clip_path: Path, clip_pictures):
    """A photo cut short: transformers' loader fails on it too (when its pixels are read);
    here it is the row's error, with the reason, and the next row reads."""
    data = photo(6)
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(OSError, match="truncated"):
        transformers_pixels(clip_path, tmp_path / "cut.jpg")
    table = pa.table({"image": [data[: len(data) * 2 // 3], data]})
    _, rows, errors = clip_pictures.pixels(table, "image")
    assert rows.tolist() == [1] and "truncated" in errors[0]


# -- what cannot be read is the row's -------------------------------------------------------


def uri_job(tmp_path: Path, clip_path: Path, **output) -> Path:
    """A shard whose rows name pictures by URIs that cannot be read here (a scheme no
    filesystem serves; ``http://`` where fsspec's HTTP client is not installed, or else a
    host that never resolves), between good pictures."""
    good = picture("disc", "blue", np.random.default_rng(1))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.png").write_bytes(good)
    values = ["good.png", "foo://bucket/x.jpg", "good.png", "http://example.invalid/x.jpg"]
    pq.write_table(
        pa.table({"image_id": list(range(4)), "image": values}), tmp_path / "in" / "uris.parquet"
    )
    return write_job(
        tmp_path / "job.toml",
        input={"path": "in", "image": "image", "id": "image_id"},
        model={"task": "embed", "path": str(clip_path)},
        output={"path": "out", **output},
    )


def test_an_unreadable_uri_is_its_rows_error(tmp_path: Path, clip_path: Path):
    """on_error = "skip": a URI no filesystem reads is its row's error, naming the URI and the
    reason; the other rows are scored and the run succeeds."""
    job = uri_job(tmp_path, clip_path, on_error="skip", max_bad_share=1.0)
    result = invoke("run", str(job), "--progress", "off")
    assert result.exit_code == 0, result.stderr
    out = read_output(tmp_path / "out")
    errors = out.column("error").to_pylist()
    assert errors[0] is None and errors[2] is None
    assert errors[1].startswith("column 'image': foo://bucket/x.jpg: cannot be read: foo://")
    assert errors[3].startswith("column 'image': http://example.invalid/x.jpg: cannot be read")
    assert [v is None for v in out.column("embedding").to_pylist()] == [
        e is not None for e in errors
    ]


def test_an_unreadable_uri_fails_its_shard_by_default(tmp_path: Path, clip_path: Path):
    """on_error = "fail": the shard fails naming its file, row and column; a message and the
    documented exit status (3), not a job error (2), never a traceback."""
    result = invoke("run", str(uri_job(tmp_path, clip_path)), "--progress", "off")
    assert result.exit_code == 3, result.stderr
    assert "uris.parquet: row 1, column 'image': foo://bucket/x.jpg: cannot be read" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_path_that_is_not_utf8_is_its_rows_error(tmp_path: Path, clip_path: Path):
    """A path column (or a datasets Image struct's path) holding bytes that are not UTF-8:
    that row's error, in the quality gate's sample (precision "auto") and in the run alike;
    the good rows scored."""
    good = picture("disc", "red", np.random.default_rng(2))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.png").write_bytes(good)
    raw = pa.array([b"good.png", b"\xff\xfe.png", b"good.png"], pa.binary())
    paths = pa.Array.from_buffers(pa.string(), 3, raw.buffers())  # unchecked bytes
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    structs = pa.StructArray.from_arrays([pa.array([good, None, None]), paths], fields=list(kind))
    pq.write_table(pa.table({"image_id": [0, 1, 2], "image": paths}), tmp_path / "in" / "a.parquet")
    pq.write_table(
        pa.table({"image_id": [3, 4, 5], "image": structs}), tmp_path / "in" / "b.parquet"
    )
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in/*.parquet", "image": "image", "id": "image_id"},
        model={"task": "embed", "path": str(clip_path), "precision": "auto"},
        output={"path": "out", "on_error": "skip", "max_bad_share": 1.0},
    )
    result = invoke("run", str(job), "--progress", "off")
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    errors = read_output(tmp_path / "out").column("error").to_pylist()
    bad = "column 'image': the path is not valid UTF-8 (byte 0)"
    assert errors == [None, bad, None, None, bad, None]
