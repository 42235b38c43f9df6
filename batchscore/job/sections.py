"""The job file's sections: one small frozen dataclass per TOML table, and the whole `Job`.

Each pipeline stage receives only its own section (the reader `InputConfig`, the sampler
`BatchingConfig`, ...), so a stage can be read, tested and changed without knowing the rest.
The dataclasses are the schema: `batchscore.job.schema` builds them from TOML, naming every
problem. Task sections are keyed by `[model].task` in `TASK_SECTIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from batchscore.job.decoding import decoding_problems
from batchscore.job.lm_sections import LoglikConfig, RewardConfig
from batchscore.job.ranges import Ranges, ranges_problems
from batchscore.job.structured import STRUCTURE_KEYS
from batchscore.job.where import RowFilter

Task = Literal["embed", "classify", "generate", "summarize", "tensor", "loglik", "reward"]
# What a task's model must be: "any" (the built-in encoder will do), "own" (a model of the
# task's kind, named by the job) or "file" (a local model file)
ModelNeeded = Literal["any", "own", "file"]
Precision = Literal["fp32", "fp16", "bf16", "int8", "auto"]
DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Upper bounds of the numbers a typo can turn into a crash or more memory than any machine has
# (`threads = 100000` crashes torch's thread pool; `num_beams = 100000` grows past 16 GB): each
# is far above any setting that makes sense, so only a mistake meets one (docs/job-file.md lists
# them).
MAX_THREADS = 1024
MAX_WINDOW_TOKENS = 1 << 20  # [model].max_length: the longest context windows made
MAX_BATCH_TOKENS = 1 << 22  # [batching].max_tokens: 4 Mi tokens in one batch
MAX_ROWS = 1 << 20  # rows in one batch or one sorting window
MAX_CHUNK_ROWS = 10_000_000  # rows in one unit of commit
MAX_COMMIT_S = 86_400.0  # [output].commit_s: a day
MAX_SAMPLE_ROWS = 1 << 16  # rows the quality gate scores twice
MAX_NEW_TOKENS = 1 << 15  # tokens generated per row
MAX_BEAMS = 64
MAX_REPETITION_PENALTY = 100.0  # [generate].repetition_penalty, and 1 / it the least
MAX_TOP_K = 1 << 18  # above every vocabulary's size, where top-k is off anyway
MAX_SENTENCES = 1 << 16  # sentences of one document ranked (and kept) by extractive summarize
MAX_FEATURES = 1 << 20  # values in one row's feature vector
MAX_ACTORS = 1024
MAX_ACTOR_CPUS = 1024.0
MAX_ACTOR_GPUS = 64.0

# The output column of a row's hash, with `[input].increments = "rows"` (`batchscore.work.row_hash`)
ROW_HASH = "_row_hash"

# A task key added after output folders were first written marks itself with this: the
# fingerprint records it only when it is set away from its default, so a folder written before
# the key existed still resumes (`batchscore.models.fingerprint.task_options`).
WHEN_SET = {"fingerprint": "when set"}


@dataclass(frozen=True)
class InputConfig:
    """Which shards to read and which of their columns matter."""

    path: tuple[str, ...]
    text: str = "text"
    features: tuple[str, ...] = ()
    id: str | None = None
    keep: tuple[str, ...] = ()
    where: str | None = None  # a SQL predicate over input columns; rows it rejects are skipped
    text_pair: str | None = None  # classify: a second text column, read with `text` as a pair
    # reward: a column of conversations, each a list of {role, content} (or its JSON text)
    messages: str | None = None
    # embed with a CLIP or SigLIP model: a column of images (encoded bytes, or paths / URIs
    # relative to the shard's folder) embedded by the image tower instead of `text`
    image: str | None = None
    # "shards": a shard that changed is scored again whole; "rows" (needs `id`): only the rows
    # whose id and values are not committed, wherever they now lie (`batchscore.output.increments`)
    increments: Literal["shards", "rows"] = "shards"

    @property
    def copied(self) -> tuple[str, ...]:
        """Input columns copied unchanged to the output: the id, then `keep`."""
        return tuple(dict.fromkeys(([self.id] if self.id else []) + list(self.keep)))

    @property
    def carried(self) -> tuple[str, ...]:
        """The columns a window carries to the output before the task's: those `copied`, then
        (by rows) each row's hash, which the reader adds (`batchscore.work.row_hash`)."""
        return self.copied + ((ROW_HASH,) if self.by_rows else ())

    @property
    def by_rows(self) -> bool:
        """Whether increments are by row (`increments = "rows"`), not by shard."""
        return self.increments == "rows"

    @property
    def row_filter(self) -> RowFilter | None:
        """`where` parsed, with the columns it reads; None when every row is kept."""
        return RowFilter(self.where) if self.where is not None else None


@dataclass(frozen=True)
class ModelConfig:
    """What to run and how: the model, its precision, device and truncation."""

    task: Task
    name: str | None = None  # a built-in, or a Hugging Face id found in the local cache
    path: str | None = None
    revision: str | None = None  # of a Hugging Face id: a branch, tag or commit in the cache
    precision: Precision = "auto"  # the fastest that passes the quality gate, measured here
    device: str = "auto"
    max_length: int | None = field(default=None, metadata={"min": 1, "max": MAX_WINDOW_TOKENS})
    threads: int | None = field(default=None, metadata={"min": 1, "max": MAX_THREADS})
    trust_remote_code: bool = False
    allow_pickle: bool = False
    long_text: Literal["truncate", "chunk"] = "truncate"  # chunk: windows over the whole text
    # torch.compile (inductor) the model's forward at load, batch and sequence sizes symbolic so
    # every length bucket shares one graph; inductor keeps the compiled code in its on-disk cache.
    # Outputs equal eager's to float noise, so it is not in the fingerprint. int8 (calibration
    # swaps layers after load) and TorchScript / torch.export files stay eager. Off by default:
    # BENCHMARKS.md ("torch.compile") has what it costs and gains.
    compile: bool = False
    # Where an fp32, bf16 or int8 model runs on the CPU: "openvino" compiles the native BERT
    # encoder for OpenVINO's runtime (`batchscore.runtime.bert_openvino`, 1.15-1.3x eager per
    # token; its outputs equal torch's to float noise, int8's within the gate's promise as on
    # any other CPU, so it is not in the fingerprint either); "torch" keeps every model in
    # eager PyTorch; "auto" is OpenVINO wherever it can run that model.
    runtime: Literal["auto", "torch", "openvino"] = "auto"


@dataclass(frozen=True)
class BatchingConfig:
    """How rows become batches: the token budget and the window the sampler sorts."""

    max_tokens: int | Literal["auto"] = field(
        default="auto", metadata={"min": 1, "max": MAX_BATCH_TOKENS}
    )
    max_rows: int = field(default=512, metadata={"min": 1, "max": MAX_ROWS})
    sort: bool = True
    window_rows: int = field(default=8192, metadata={"min": 1, "max": MAX_ROWS})
    # Decoder-only generation only (other tasks ignore both): rows that finish leave the batch
    # and waiting rows take their seats, and the prompts' shared start is computed once. Neither
    # changes a row's output, so neither is part of the fingerprint.
    continuous: bool = True
    prefix_cache: bool = True


@dataclass(frozen=True)
class OutputConfig:
    """Where results go and how large a unit of commit is."""

    path: str
    on_error: Literal["fail", "skip"] = "fail"
    max_bad_share: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    chunk_rows: int = field(default=50_000, metadata={"min": 1, "max": MAX_CHUNK_ROWS})
    # seconds a scored row may wait for its commit: a chunk still open after it commits the
    # rows it has as a piece of itself, and windows are sized to take a fraction of it
    # (`batchscore.output.committer`, `batchscore.pipeline.pace`). It decides which files
    # hold the rows, never the rows: not part of the fingerprint
    commit_s: float = field(default=300.0, metadata={"min": 1.0, "max": MAX_COMMIT_S})
    # each row's tokens as its model read them (`prompt_tokens`; generation adds what it wrote),
    # and the run's totals in its report, summary and metrics: what an API would have charged
    usage: bool = False
    # "delta", "iceberg": the folder is a table too (its extra; `output.format_table`)
    format: Literal["parquet", "delta", "iceberg"] = "parquet"
    # iceberg: the properties of the pyiceberg catalog to register the table in (e.g. {type =
    # "rest", uri = "https://..."}); empty: its own SQLite catalog under _batchscore/
    catalog: dict[str, str] = field(default_factory=dict)
    table_name: str = "batchscore.scores"  # iceberg: the table's namespace and name there


@dataclass(frozen=True)
class QualityConfig:
    """[quality]: how closely a precision other than fp32 must agree with fp32 on the job's rows.

    Measured in rounds of the first rows, up to ``sample_rows``, until its promise is kept
    (`batchscore.measure.promise`), before the first chunk (recorded: resumes reuse it).
    """

    sample_rows: int = field(default=256, metadata={"min": 1, "max": MAX_SAMPLE_ROWS})
    max_share_below: float = field(default=0.05, metadata={"min": 0.0, "max": 1.0})
    confidence: float = field(default=0.95, metadata={"min": 0.5, "max": 0.999999})
    min_cosine: float = field(default=0.99, metadata={"min": -1.0, "max": 1.0})
    min_agreement: float = field(default=0.99, metadata={"min": 0.0, "max": 1.0})
    min_exact_match: float = field(default=0.9, metadata={"min": 0.0, "max": 1.0})
    max_relative_error: float = field(default=0.01, metadata={"min": 0.0})
    accept: bool = False  # score even when the precision fails the gate (--accept-quality)
    # where "auto" keeps what it measured on this machine (`batchscore.measure.cache`): a
    # volume fresh containers mount, say; default $BATCHSCORE_CACHE_DIR, else the user's cache
    cache_dir: str | None = None


@dataclass(frozen=True)
class EmbedConfig:
    """[embed]: the embedding task's options.

    ``normalize`` L2-normalises vectors the model's own stack leaves unnormalised (a stack that
    ends in Normalize is always normalised); ``prompt_name`` picks one of the model's prompts
    (default: the one its sentence-transformers config names, if any).

    A dense model's vectors can be cut to their first ``truncate_dim`` dimensions (Matryoshka
    models are trained for it) and written ``quantize``d as sentence-transformers'
    ``quantize_embeddings`` does; int8 and uint8 map each dimension's ``ranges`` (its minimum,
    then its maximum) onto 256 steps, measured on the job's first distinct texts unless given
    here (a dimension with no width is refused, `batchscore.job.ranges`). A sparse encoder
    keeps its ``top_k`` largest weights (default: the model's own limit, if any).
    """

    # what the task asks of the other sections (class attributes, not job keys; job.load checks)
    model_needed: ClassVar[ModelNeeded] = "any"
    reads_pairs: ClassVar[bool] = False
    windows: ClassVar[bool] = True

    normalize: bool = True
    prompt_name: str | None = None
    truncate_dim: int | None = field(
        default=None, metadata={"min": 1, "max": MAX_FEATURES, **WHEN_SET}
    )
    quantize: Literal["int8", "uint8", "binary", "ubinary"] | None = field(
        default=None, metadata=WHEN_SET
    )
    # [[min per dimension], [max ...]]
    ranges: Ranges | None = field(default=None, metadata=WHEN_SET)
    top_k: int | None = field(default=None, metadata={"min": 1, "max": MAX_TOP_K, **WHEN_SET})

    def problems(self) -> list[str]:
        """What is wrong with these keys together (each message starts with its key); what
        depends on the model (its dimensions, dense or sparse) is checked against it."""
        return ranges_problems(self.quantize, self.ranges)


@dataclass(frozen=True)
class ClassifyConfig:
    """[classify]: a sequence-classification model's label, and optionally every probability.

    A one-logit model (a reranker) writes a ``score`` alone: its logit through ``activation``,
    "auto" being the one its files name as sentence-transformers' CrossEncoder reads them
    (Sigmoid where they name none); "none" keeps the raw logit.
    """

    # what the task asks of the other sections (class attributes, not job keys; job.load checks)
    model_needed: ClassVar[ModelNeeded] = "own"
    reads_pairs: ClassVar[bool] = True
    windows: ClassVar[bool] = True

    all_scores: bool = False
    activation: Literal["auto", "sigmoid", "tanh", "none"] = field(
        default="auto", metadata=WHEN_SET
    )


@dataclass(frozen=True)
class GenerateConfig:
    """[generate]: a prompt template over input columns and how to decode.

    Greedy unless ``num_beams > 1`` (beam search) or ``do_sample`` (seeded sampling, where
    ``temperature``, ``top_k`` (0: off) and ``top_p`` (1: off) shape the distribution).
    ``chat`` wraps each row's prompt as the user turn of the model's chat template (after a
    ``system`` message, if given); ``stop`` ends a row at the first of these strings (not
    written); ``repetition_penalty`` is transformers' (1: off; None: the model's own, if any).
    ``json_schema`` (a table, or a JSON file's path), ``choices`` or ``regex`` constrain what a
    row may generate (one of them; docs/structured.md).
    """

    # what the task asks of the other sections (class attributes, not job keys; job.load checks)
    model_needed: ClassVar[ModelNeeded] = "own"
    reads_pairs: ClassVar[bool] = False
    windows: ClassVar[bool] = False

    prompt: str | None = None
    max_new_tokens: int = field(default=64, metadata={"min": 1, "max": MAX_NEW_TOKENS})
    num_beams: int = field(default=1, metadata={"min": 1, "max": MAX_BEAMS})
    do_sample: bool = False
    temperature: float = field(default=1.0, metadata={"min": 0.01})
    top_k: int = field(default=0, metadata={"min": 0, "max": MAX_TOP_K})
    top_p: float = field(default=1.0, metadata={"min": 0.01, "max": 1.0})
    seed: int = field(default=0, metadata={"min": 0})
    chat: bool = field(default=False, metadata=WHEN_SET)
    system: str | None = field(default=None, metadata=WHEN_SET)
    # each row's text is a JSON list of chat messages ({role, content}), as OpenAI's chat
    # requests carry a conversation, rendered whole through the chat template
    messages: bool = field(default=False, metadata=WHEN_SET)
    stop: tuple[str, ...] = field(default=(), metadata=WHEN_SET)
    # Above 1 penalizes tokens already in the row (prompt included), below 1 favours them; past
    # MAX_REPETITION_PENALTY either way a logit is scaled into noise, which only a typo asks for.
    repetition_penalty: float | None = field(
        default=None,
        metadata={"min": 1 / MAX_REPETITION_PENALTY, "max": MAX_REPETITION_PENALTY, **WHEN_SET},
    )
    # structured generation: a file's path is read by job.parse, which puts the schema here
    json_schema: dict[str, Any] | str | None = field(default=None, metadata=WHEN_SET)
    choices: tuple[str, ...] | None = field(default=None, metadata=WHEN_SET)
    regex: str | None = field(default=None, metadata=WHEN_SET)

    @property
    def structure(self) -> tuple[str, Any] | None:
        """The structure key that is set and its value (``problems`` allows one at most)."""
        for key in STRUCTURE_KEYS:
            if getattr(self, key) is not None:
                return key, getattr(self, key)
        return None

    def problems(self) -> list[str]:
        """What is wrong with these keys together (`batchscore.job.decoding`)."""
        return decoding_problems(self)


@dataclass(frozen=True)
class SummarizeConfig:
    """[summarize]: extractive summaries built from sentence embeddings, or abstractive ones.

    The first three keys drive the extractive default (an encoder such as MiniLM); ``prompt``,
    ``max_new_tokens`` and ``num_beams`` apply when `[model].path` is a generative model.
    """

    # what the task asks of the other sections (class attributes, not job keys; job.load checks)
    model_needed: ClassVar[ModelNeeded] = "any"
    reads_pairs: ClassVar[bool] = False
    windows: ClassVar[bool] = True

    sentences: int = field(default=3, metadata={"min": 1, "max": MAX_SENTENCES})
    diversity: float = field(default=0.3, metadata={"min": 0.0, "max": 1.0})
    max_sentences: int = field(default=256, metadata={"min": 1, "max": MAX_SENTENCES})
    prompt: str | None = None
    max_new_tokens: int = field(default=128, metadata={"min": 1, "max": MAX_NEW_TOKENS})
    num_beams: int = field(default=1, metadata={"min": 1, "max": MAX_BEAMS})


@dataclass(frozen=True)
class TensorConfig:
    """[tensor]: a numeric model over feature columns; `output` says how to read its rows."""

    # what the task asks of the other sections (class attributes, not job keys; job.load checks)
    model_needed: ClassVar[ModelNeeded] = "file"
    reads_pairs: ClassVar[bool] = False
    windows: ClassVar[bool] = False

    output: Literal["class", "value"]
    format: Literal["auto", "torchscript", "export", "safetensors"] = "auto"
    factory: str | None = None
    factory_args: dict[str, Any] = field(default_factory=dict)
    num_features: int | None = field(default=None, metadata={"min": 1, "max": MAX_FEATURES})


@dataclass(frozen=True)
class RayConfig:
    """[ray]: the cluster the Ray engine joins and the model actors it starts there.

    ``address`` None starts a local Ray instance; "auto" or ``ray://host:10001`` joins one.
    ``actors`` defaults to one per GPU (``num_gpus`` each), or one per ``num_cpus`` CPU slots.
    """

    address: str | None = None
    actors: int | None = field(default=None, metadata={"min": 1, "max": MAX_ACTORS})
    num_cpus: float = field(default=1.0, metadata={"min": 0.0, "max": MAX_ACTOR_CPUS})
    num_gpus: float | None = field(default=None, metadata={"min": 0.0, "max": MAX_ACTOR_GPUS})


TASK_SECTIONS: dict[str, type] = {
    "embed": EmbedConfig,
    "classify": ClassifyConfig,
    "generate": GenerateConfig,
    "summarize": SummarizeConfig,
    "tensor": TensorConfig,
    "loglik": LoglikConfig,
    "reward": RewardConfig,
}
SECTIONS: dict[str, type] = {
    "input": InputConfig,
    "model": ModelConfig,
    "batching": BatchingConfig,
    "output": OutputConfig,
    "quality": QualityConfig,
    "ray": RayConfig,
    **TASK_SECTIONS,
}
Engine = Literal["local", "ray"]
# The section of the job's own task, one of TASK_SECTIONS' classes
TaskOptions = (
    EmbedConfig
    | ClassifyConfig
    | GenerateConfig
    | SummarizeConfig
    | TensorConfig
    | LoglikConfig
    | RewardConfig
)


@dataclass(frozen=True)
class Job:
    """A whole validated job; `options` holds the section of the job's own task (`[embed]`, ...)."""

    name: str
    source: Path
    input: InputConfig
    model: ModelConfig
    batching: BatchingConfig
    output: OutputConfig
    options: TaskOptions
    quality: QualityConfig = field(default_factory=QualityConfig)
    engine: Engine = "local"  # where chunks are scored: this process, or actors on a Ray cluster
    ray: RayConfig = field(default_factory=RayConfig)
