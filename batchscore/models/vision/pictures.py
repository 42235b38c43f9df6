"""Images as a two-tower model reads them: each row's value opened with Pillow, checked, and
made into pixels by the model's own image processor (its ``preprocessor_config.json``), so the
vectors are those of ``get_image_features`` on the processor's pixels.

A value is encoded bytes, a path or URI (relative ones are relative to the row's shard folder,
`batchscore.work.folders`), or a Hugging Face datasets ``Image`` struct of both. Whatever cannot
be read (missing, not an image, truncated) is that row's error, with the reason, never a crash;
so is an image of more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS`` (a decompression bomb:
a small file that decodes to gigabytes), checked per row from its header, before decoding.
"""

from __future__ import annotations

import io
import os.path
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import JobError, ModelError
from batchscore.files import Refused, read_shared
from batchscore.storage.fs import filesystem, is_url, local_path
from batchscore.work.folders import FOLDER
from batchscore.work.shards import is_text
from batchscore.work.text_bytes import undecoded

MAX_IMAGE_BYTES = 256 << 20  # one encoded image file read, at most
# The raster formats image datasets hold, the only ones opened: Pillow would otherwise also
# try EPS (which runs Ghostscript on untrusted bytes), WMF, scientific formats and more.
FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "DIB", "TIFF", "PPM", "TGA", "ICO", "AVIF")
# decoded pixels (float32) one window holds: the window's rows are cut to fit it
WINDOW_PIXEL_BYTES = 256 << 20


def load_processor(folder: Path) -> Any:
    """The model's own image processor, from its folder (no download)."""
    from transformers import AutoImageProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "falls back to the PIL processor" without torchvision
    try:
        return AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"{folder}: no image processor ({exc}); a CLIP or SigLIP folder ships its "
            "preprocessor_config.json"
        ) from exc


def image_values(
    table: pa.Table, column: str
) -> tuple[list[Any], list[str | None], dict[int, str]]:
    """Each row's image, as its encoded bytes or a path (str), or None; each row's folder; and
    the rows whose path is not UTF-8, with why. A datasets ``Image`` struct gives its bytes
    when embedded, else its path. Paths are decoded row by row (`undecoded`): one that is
    not UTF-8 is its row's error, not the window's."""
    array = table.column(column)
    named = is_text(array.type)  # paths or URIs, read here as their bytes
    values: list[Any] = []
    errors: dict[int, str] = {}
    for row, value in enumerate(undecoded(array).to_pylist()):
        path = named
        if isinstance(value, dict):
            path = not value.get("bytes")
            value = value.get("bytes") or value.get("path")
        if path and value is not None:
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors[row] = f"column {column!r}: the path is not valid UTF-8 (byte {exc.start})"
        values.append(value)
    if FOLDER in table.column_names:
        return values, table.column(FOLDER).to_pylist(), errors
    return values, [None] * len(values), errors


def read_bytes(name: str, folder: str | None) -> bytes:
    """An image file's bytes: a URI through its filesystem, a relative path joined to the
    row's shard ``folder`` (a folder or a URL) first."""
    relative = not is_url(name) and not name.startswith("file://") and not os.path.isabs(name)
    if relative and folder:
        name = f"{folder}/{name}" if is_url(folder) else os.path.join(folder, name)
    if is_url(name):
        data = read_uri(name)
        if len(data) > MAX_IMAGE_BYTES:
            raise ValueError(f"{name}: more than the {MAX_IMAGE_BYTES:,} bytes read")
        return data
    # links followed (a dataset's pictures may be links into a cache), then only a regular
    # file read, to a cap: a FIFO or a device named by a row would hang the reader
    path = Path(os.path.realpath(local_path(name)))
    data = read_shared(path, MAX_IMAGE_BYTES)
    if data is None:
        raise FileNotFoundError(f"{path}: no such file")
    return data


def read_uri(name: str) -> bytes:
    """An image's bytes from the store a URI names. A URI is a row's value: one that cannot
    be read here (a scheme no filesystem serves, ``http://`` without fsspec's HTTP client, a
    store's own error for one object) is that row's error, not the job's."""
    try:
        fs, where = filesystem(name)
        with fs.open_input_stream(where) as stream:
            return stream.read(MAX_IMAGE_BYTES + 1)
    except Exception as exc:  # JobError for the scheme, OSError or a store client's own
        raise ValueError(f"{name}: cannot be read: {exc}") from None


def encoded(value: bytes | str | None, folder: str | None) -> bytes:
    """A row's encoded image (`image_values`): its bytes, or those of the file it names."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("no image (an empty path)")
        return read_bytes(value, folder)
    if not value:
        raise ValueError("no image (null or empty)")
    return value


def pillow() -> None:
    """Pillow decodes the images; without it a job that reads images stops before its first
    row with the extra that installs it, not a traceback at the first picture."""
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise JobError(
            "[input].image: decoding images needs Pillow: pip install 'batchscore[images]'"
        ) from exc


def known_formats() -> tuple[str, ...]:
    """`FORMATS` this Pillow can open (AVIF needs a Pillow built with it)."""
    from PIL import Image

    Image.init()
    return tuple(f for f in FORMATS if f in Image.OPEN)


def open_image(data: bytes) -> Any:
    """The decoded RGB image, or ValueError with the reason it cannot be."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    limit = Image.MAX_IMAGE_PIXELS  # read per row: a caller may raise it for big scans
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below
            image = Image.open(io.BytesIO(data), formats=known_formats())
            width, height = image.size
            if limit and width * height > limit:
                raise ValueError(
                    f"image of {width}x{height} pixels, more than Pillow's "
                    f"MAX_IMAGE_PIXELS ({limit:,}): refused as a decompression bomb"
                )
            image.load()  # the whole decode: a truncated file fails here
            # shown as a viewer shows it, as transformers' `load_image` does: a phone stores
            # its sensor's pixels and an EXIF orientation that turns them upright
            return ImageOps.exif_transpose(image).convert("RGB")
    except Image.DecompressionBombError as exc:
        raise ValueError(f"refused as a decompression bomb: {exc}") from None
    except UnidentifiedImageError:
        formats = ", ".join(known_formats())
        raise ValueError(f"not an image in a format read here ({formats})") from None
    except ValueError:
        raise
    except Exception as exc:  # untrusted bytes: Pillow's decoders raise OSError
        # for truncated data, and struct.error, IndexError or others for malformed headers
        raise ValueError(f"cannot decode the image: {exc}") from None


class Pictures:
    """A model's image processor: a column of images to float32 pixels, row errors beside."""

    def __init__(self, folder: Path) -> None:
        pillow()
        self.processor = load_processor(folder)

    def pixels(self, table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
        """Pixels of every row that reads, [rows, 3, H, W] float32; those rows; the others'
        errors (window row -> reason, naming the column)."""
        values, folders, errors = image_values(table, column)
        pixels, rows = [], []
        for row, (value, folder) in enumerate(zip(values, folders, strict=True)):
            if row in errors:
                continue
            try:
                pixels.append(self.one(open_image(encoded(value, folder))))
            except (ValueError, OSError, Refused) as exc:
                errors[row] = f"column {column!r}: {exc}"
                continue
            rows.append(row)
        if not pixels:
            return np.zeros((0, 3, 1, 1), np.float32), np.zeros(0, np.int64), errors
        return np.stack(pixels), np.asarray(rows, np.int64), errors

    def one(self, image: Any) -> np.ndarray:
        """One image's pixels [3, H, W] float32, as the processor makes them: one at a time,
        so an image it cannot take (an odd shape) is that row's error alone."""
        try:
            out = self.processor(images=[image], return_tensors="np")["pixel_values"]
        except Exception as exc:  # whatever the processor meets in one image
            raise ValueError(f"the image processor cannot take the image: {exc}") from None
        return np.asarray(out[0], dtype=np.float32)
