"""One peer of `scripts/bench_peers.py`, run inside that peer's own virtual environment.

Imports only the standard library, numpy and what the peer's environment holds
(sentence-transformers on torch, ONNX Runtime or OpenVINO), never batchscore.

    python peer_worker.py export onnx|openvino MODEL_DIR DEST      # untimed, once
    python peer_worker.py run VARIANT TEXTS.json MODEL_DIR OUT.npy THREADS

`export` copies the model folder and writes the backend's files into the copy: fp32 and int8
(ONNX Runtime's dynamic int8 for this CPU's instruction set; OpenVINO's static int8 by NNCF,
calibrated on corpus texts passed in DEST/calibration.json). `run` encodes the texts as a user
would (`encode`, its default batch size) and prints one JSON line: load and encode seconds,
the seconds in the transformer's forward alone, and the real and padded tokens of the batches
the model saw.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

START = time.perf_counter()
FP32_FILES = {"onnx": "onnx/model.onnx", "openvino": "openvino/openvino_model.xml"}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def onnx_int8_config() -> str:
    """sentence-transformers' dynamic int8 preset for the best instruction set this CPU has."""
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def export(backend: str, model_dir: Path, dest: Path) -> None:
    from sentence_transformers import SentenceTransformer

    target = dest / "model"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("onnx", "openvino"))
    model = SentenceTransformer(str(target), device="cpu", backend=backend)
    model.save_pretrained(str(target))  # the export made at load: onnx/ or openvino/
    if backend == "onnx":
        from sentence_transformers import export_dynamic_quantized_onnx_model

        preset = onnx_int8_config()
        export_dynamic_quantized_onnx_model(model, preset, str(target))
        (made,) = (target / "onnx").glob(f"model_*int8_{preset}.onnx")  # qint8 or quint8
        (dest / "int8.json").write_text(json.dumps({"file_name": f"onnx/{made.name}"}))
    else:
        texts = json.loads((dest / "calibration.json").read_text())
        file_name = openvino_int8(model, target, texts)
        (dest / "int8.json").write_text(json.dumps({"file_name": file_name}))


def openvino_int8(model, target: Path, texts: list[str]) -> str:
    """Static int8 (weights and activations) by NNCF, as sentence-transformers'
    `export_static_quantized_openvino_model` makes it, calibrated on local texts instead of a
    data set from the hub."""
    import nncf
    import openvino as ov

    core = ov.Core()
    ov_model = core.read_model(str(target / "openvino/openvino_model.xml"))
    names = {port.get_any_name() for port in ov_model.inputs}
    samples = []
    for text in texts:
        features = getattr(model, "preprocess", model.tokenize)([text])  # tokenize before v6
        samples.append({k: v.numpy() for k, v in features.items() if k in names})
    quantized = nncf.quantize(
        ov_model,
        nncf.Dataset(samples),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(samples),
    )
    file_name = "openvino/openvino_model_qint8_quantized.xml"
    ov.save_model(quantized, str(target / file_name))
    return file_name


def load(variant: str, model_dir: Path, threads: int):
    """The model as each peer's documentation says to load it, held to ``threads`` threads."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    backend, _, precision = variant.partition("-")
    kwargs: dict = {}
    if backend == "torch" and precision == "bf16":
        import transformers

        key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        kwargs[key] = torch.bfloat16
    if backend == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        kwargs["session_options"] = options
        kwargs["provider"] = "CPUExecutionProvider"
    if backend == "openvino":
        kwargs["ov_config"] = {"INFERENCE_NUM_THREADS": threads}
        if precision == "fp32":
            kwargs["ov_config"]["INFERENCE_PRECISION_HINT"] = "f32"
    if precision == "int8":
        kwargs.update(json.loads((model_dir.parent / "int8.json").read_text()))
    elif backend in FP32_FILES:  # the fp32 export, named: the int8 one lies beside it
        kwargs["file_name"] = FP32_FILES[backend]
    return SentenceTransformer(
        str(model_dir), device="cpu", backend=backend, model_kwargs=kwargs or None
    )


def note(variant: str) -> str:
    """The table's note: what the peer chose on its own here (OpenVINO's default precision)
    and what it runs as (bf16 without native kernels, the int8 flavour)."""
    if variant == "openvino-default":
        import openvino as ov

        hint = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        return f"runs {hint.get_type_name()} here"
    if variant == "torch-bf16" and not {"avx512_bf16", "amx_bf16"} & cpu_flags():
        return "no native bf16 here: emulated"
    if variant == "onnx-int8":
        return f"dynamic int8, {onnx_int8_config()} preset"
    if variant == "openvino-int8":
        return "static int8 (NNCF)"
    return ""


def run(variant: str, texts_file: Path, model_dir: Path, out: Path, threads: int) -> None:
    import numpy as np

    texts = json.loads(texts_file.read_text())
    model = load(variant, model_dir, threads)
    loaded = time.perf_counter()
    counts = {"tokens": 0, "padded": 0, "batches": 0}
    model_s, began = [0.0], [0.0]

    def count(module, args, kwargs):  # the batches the model sees, padded to their longest row
        features = args[0] if args else kwargs["features"]
        counts["padded"] += int(features["input_ids"].numel())
        counts["tokens"] += int(features["attention_mask"].sum())
        counts["batches"] += 1
        began[0] = time.perf_counter()

    def timed(module, args, output):  # the transformer's forward alone: no tokenizing, pooling
        model_s[0] += time.perf_counter() - began[0]

    model[0].register_forward_pre_hook(count, with_kwargs=True)
    model[0].register_forward_hook(timed)
    vectors = model.encode(texts, convert_to_numpy=True)
    done = time.perf_counter()
    if not counts["batches"]:
        raise SystemExit(f"{variant}: counted no batch; the token count hook did not fire")
    np.save(out, vectors.astype(np.float32))
    result = {"load_s": loaded - START, "encode_s": done - loaded, "model_s": model_s[0],
              "note": note(variant)}  # fmt: skip
    print(json.dumps({**result, **counts, "versions": versions(variant)}))


def versions(variant: str) -> str:
    """The packages that decide this peer's speed, as installed in its environment."""
    from importlib.metadata import version

    names = ["sentence-transformers", "transformers", "torch"]
    names += {
        "onnx": ["optimum-onnx", "onnxruntime"],
        "openvino": ["optimum-intel", "openvino"],
    }.get(variant.partition("-")[0], [])
    return ", ".join(f"{name} {version(name)}" for name in names)


def main() -> None:
    if sys.argv[1] == "export":
        export(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        variant, texts, model_dir, out, threads = sys.argv[2:7]
        run(variant, Path(texts), Path(model_dir), Path(out), int(threads))


if __name__ == "__main__":
    main()
