"""Make the example model and images for jobs/embed_images.toml: a tiny CLIP and a shard of
generated pictures.

The model is a CLIP of random weights, 2 layers of width 32 per tower, reading 32x32 images in
patches of 8 (17 positions per image) and texts through a byte-level CLIP tokenizer of 512
symbols and a handful of merges, with its image processor's config: built from a config, no
download. It shows the plumbing, not meaning: its vectors are those of ``get_image_features``
on random weights. The shard holds a few hundred pictures of coloured shapes as PNG bytes, and
a second shard names files beside it by relative path.

    python scripts/images_example.py data/images models/tiny-clip
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SHAPES = ["square", "disc", "stripe"]
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220)}


def byte_symbols() -> list[str]:
    """GPT-2's and CLIP's printable stand-ins for the 256 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    codes, extra = list(printable), 0
    symbols = dict(zip(printable, printable, strict=True))
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = 256 + extra
            codes.append(byte)
            extra += 1
    return [chr(symbols[b]) for b in range(256)]


def clip_tokenizer(folder: Path) -> int:
    """A CLIP tokenizer (vocab.json, merges.txt, tokenizer.json) of every byte, alone and at a
    word's end, and a few merges; returns its vocabulary's size."""
    from transformers import CLIPTokenizer

    symbols = byte_symbols()
    merges = ["t h", "th e</w>", "a n", "an d</w>", "s h", "r e", "e d</w>"]
    words = [*symbols, *(s + "</w>" for s in symbols)]
    words += ["".join(m.split()) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    return len(vocab)


def tiny_clip(folder: Path, seed: int = 0, image_size: int = 32, patch: int = 8) -> Path:
    """A random-weight CLIPModel with its tokenizer and image processor, saved to ``folder``."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    vocab = clip_tokenizer(folder)
    tower = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2}
    config = CLIPConfig(
        text_config={
            **tower,
            "num_attention_heads": 2,
            "vocab_size": vocab,
            "max_position_embeddings": 77,
            "bos_token_id": vocab - 2,
            "eos_token_id": vocab - 1,
            "pad_token_id": vocab - 1,
        },
        vision_config={
            **tower,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": patch,
        },
        projection_dim=16,
    )
    torch.manual_seed(seed)
    CLIPModel(config).eval().save_pretrained(folder)
    crop = {"height": image_size, "width": image_size}
    CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=crop).save_pretrained(folder)
    return folder


def picture(shape: str, colour: str, rng: np.random.Generator) -> bytes:
    """A PNG of one coloured shape on a noisy background, of a random size."""
    from PIL import Image, ImageDraw

    width, height = (int(v) for v in rng.integers(24, 96, size=2))
    base = rng.integers(180, 255, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    box = (width // 5, height // 5, width - width // 5, height - height // 5)
    fill = COLOURS[colour]
    if shape == "disc":
        draw.ellipse(box, fill=fill)
    elif shape == "stripe":
        draw.rectangle((0, height // 3, width, 2 * height // 3), fill=fill)
    else:
        draw.rectangle(box, fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def images(out: Path, rows: int = 240, seed: int = 0) -> None:
    """Shard 0: pictures as bytes; shard 1: the same kind of pictures as files named by paths
    relative to the shard (``files/NNNN.png``)."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "files").mkdir(exist_ok=True)
    for shard in range(2):
        ids, shapes, colours, values = [], [], [], []
        for i in range(rows // 2):
            shape, colour = SHAPES[rng.integers(3)], list(COLOURS)[rng.integers(3)]
            data = picture(shape, colour, rng)
            row = shard * (rows // 2) + i
            if shard == 1:
                name = f"files/{row:04d}.png"
                (out / name).write_bytes(data)
                values.append(name)
            else:
                values.append(data)
            ids.append(row)
            shapes.append(shape)
            colours.append(colour)
        table = pa.table(
            {
                "image_id": pa.array(ids, pa.int64()),
                "caption": [f"a {c} {s}" for c, s in zip(colours, shapes, strict=True)],
                "image": pa.array(values, pa.binary() if shard == 0 else pa.string()),
            }
        )
        pq.write_table(table, out / f"part-{shard}.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the image shards' folder to write")
    parser.add_argument("model", type=Path, help="the model folder to write")
    parser.add_argument("--rows", type=int, default=240, help="pictures in all")
    args = parser.parse_args()
    images(args.data, args.rows)
    tiny_clip(args.model)
    print(f"wrote {args.rows} pictures to {args.data} and a tiny CLIP to {args.model}")


if __name__ == "__main__":
    main()
