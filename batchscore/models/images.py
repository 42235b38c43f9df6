"""embed with a two-tower model (CLIP, SigLIP): images through the image tower, or texts
through the text tower, into one space.

`[input].image` names a column of images (`batchscore.models.vision.pictures`): each row's
vector is the model's ``get_image_features`` on its own processor's pixels. Without it the same
model embeds `[input].text` with ``get_text_features``, so a text query and the images it
describes compare by cosine. Images are decoded and resized in the reader's thread (the
encoding, as a text is tokenized there), and the reader's windows are cut to hold at most
`WINDOW_PIXEL_BYTES` of pixels; each image counts the positions its tower reads (patches, and
CLIP's class token) as its length, so `[batching].max_tokens` and `max_rows` bound a batch of
images as they bound one of texts. The model's folder is found by its config
(`batchscore.models.vision.family`), never its name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.errors import JobError, ModelError
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models import agreement
from batchscore.models.agreement import Agreement, Columns
from batchscore.models.base import Adapter, fields, vectors_to_arrow
from batchscore.models.source.locate import check_model_files
from batchscore.models.text.inputs import text_rows
from batchscore.models.text.text import TextEncoder
from batchscore.models.vision.family import Towers, find_towers
from batchscore.models.vision.pictures import WINDOW_PIXEL_BYTES, Pictures
from batchscore.models.vision.towers import ImageTower, TextTower, load_towers, output_dim
from batchscore.runtime.executor import Executor
from batchscore.work.units import Encoded

# [embed] keys for a single encoder's vectors that a two-tower model does not take
NOT_FOR_TOWERS = ("prompt_name", "truncate_dim", "quantize", "ranges", "top_k")


def towers_of(path: Path) -> Towers:
    """The two-tower model at ``path``; a `ModelError` when it holds none."""
    towers = find_towers(path)
    if towers is None:
        raise ModelError(
            f"{path}: [input].image needs a CLIP or SigLIP model (transformers' CLIPModel or "
            "SiglipModel folder, or a sentence-transformers CLIP folder)"
        )
    return towers


def check_options(towers: Towers, options: EmbedConfig) -> None:
    """`[embed]` keys a two-tower model does not take, every one at once (exit 2)."""
    problems = [
        f"[embed].{key}: not for {towers.kind.upper()} models ({towers.source}); leave it out"
        for key in NOT_FOR_TOWERS
        if getattr(options, key) is not None
    ]
    if problems:
        raise JobError(problems)


class TowersEncoding:
    """Rows to units for one tower: a row's image as pixels, or its text as token ids.

    An image unit's length (``Encoded.lengths``) is the positions its tower reads,
    `Towers.patches`: the tokens the model saw for that row, what a per-row usage count
    writes for an image, as a text's is its token ids' length."""

    def __init__(
        self, path: Path, *, model: ModelConfig, options: EmbedConfig, inp: InputConfig
    ) -> None:
        self.towers = towers_of(path)
        check_options(self.towers, options)
        self.image = inp.image
        self.inputs = (inp.image or inp.text,)
        self.bucketing = inp.image is None  # every image is as long as the next
        self.max_window_rows: int | None = None
        if inp.image is not None:
            size = self.towers.image_size
            self.pictures = Pictures(self.towers.folder)
            self.max_window_rows = max(1, WINDOW_PIXEL_BYTES // (3 * size * size * 4))
        else:
            positions = self.towers.text_positions
            if model.max_length and model.max_length > positions:
                raise ModelError(
                    f"[model].max_length: {model.max_length} is more than the "
                    f"{positions} positions of {path}'s text tower; lower it or leave it out"
                )
            self.text = TextEncoder(
                self.towers.folder, model.max_length or positions, model.trust_remote_code
            )

    def encode(self, table: pa.Table) -> Encoded:
        if self.image is None:
            texts, rows, errors = text_rows(table, self.inputs[0])
            return self.text.tokens(texts).encoded(rows, errors)
        pixels, rows, errors = self.pictures.pixels(table, self.image)
        lengths = np.full(len(rows), self.towers.patches, dtype=np.int64)
        owners = np.arange(len(rows), dtype=np.int64)
        # repeats are scored once, and the quality gate's rows not again, by their pixels
        keys = [hashlib.blake2b(p.tobytes(), digest_size=16).digest() for p in pixels]
        return Encoded(lengths, owners, rows, errors, extra={"pixels": pixels, "keys": keys})


class TowersTask(Adapter):
    """embed with a CLIP or SigLIP model: one `embedding` per row,
    fixed_size_list<float32>[dim], from its image or its text."""

    encoding_type = TowersEncoding

    @staticmethod
    def input_kinds(inp: InputConfig, options: object) -> dict[str, str]:
        return {inp.image: "image"} if inp.image else {inp.text: "text"}

    @classmethod
    def output_names(cls, options: object) -> tuple[str, ...]:
        return ("embedding",)

    @classmethod
    def check_files(cls, path: Path, options: EmbedConfig, *, allow_pickle: bool) -> None:
        towers = towers_of(path)
        check_model_files(towers.folder, allow_pickle)
        if not (towers.folder / "preprocessor_config.json").is_file():
            raise ModelError(f"{towers.folder}: no preprocessor_config.json (its image processor)")
        check_options(towers, options)

    @classmethod
    def fingerprint_parts(
        cls, model: ModelConfig, path: Path, options: EmbedConfig
    ) -> dict[str, str]:
        towers = towers_of(path)
        return {"towers": towers.kind, **({"stack_normalize": "1"} if towers.normalize else {})}

    def __init__(
        self,
        path: Path,
        *,
        model: ModelConfig,
        options: EmbedConfig,
        inp: InputConfig,
        executor: Executor,
    ) -> None:
        encoding = self.set_up(path, model=model, options=options, inp=inp)
        self.max_window_rows = encoding.max_window_rows
        towers = encoding.towers
        loaded = load_towers(towers, model, executor)
        self.dim = output_dim(loaded)
        tower = ImageTower(loaded) if inp.image else TextTower(loaded)
        self.model = executor.prepare(tower)
        self.executor = executor
        self.normalize = options.normalize or towers.normalize
        self.columns = fields(
            self.output_names(options), {"embedding": pa.list_(pa.float32(), self.dim)}
        )

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        """One batch of images or texts through its tower: float32 [units, dim] on the host."""
        tensor = self.executor.tensor
        if self.encoding.image is not None:
            pixels = np.ascontiguousarray(encoded.extra["pixels"][batch])
            vectors = self.model(tensor(pixels))
        else:
            input_ids, mask = self.collate([encoded.ids[i] for i in batch])
            vectors = self.model(tensor(input_ids), tensor(mask))
        return vectors.float().cpu().numpy()  # the device-to-host copy: a sync point on CUDA

    def collate(self, ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids padded as the model's processor pads them: to the longest text (CLIP reads
        its mask), or SigLIP's to all its positions, read without a mask as it was trained."""
        text = self.encoding.text
        if self.encoding.towers.kind != "siglip":
            return text.collate(ids)
        width = max(self.encoding.towers.text_positions, max(len(i) for i in ids))
        input_ids = np.full((len(ids), width), text.pad_id, dtype=np.int64)
        for row, row_ids in enumerate(ids):
            input_ids[row, : len(row_ids)] = row_ids
        return input_ids, np.ones_like(input_ids)

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        vectors = np.asarray(results, dtype=np.float32).reshape(len(encoded.rows), self.dim)
        if self.normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return {"embedding": vectors_to_arrow(vectors, self.dim)}

    def agreement(self, reference: Columns, candidate: Columns, gate: QualityConfig) -> Agreement:
        return agreement.vectors(reference, candidate, "embedding", gate)
