"""The tensor task: feature columns, formats told apart by content, safe loading, factories."""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from batchscore.errors import InputDataError, JobError, ModelError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import InputConfig, ModelConfig, TensorConfig
from batchscore.models.numeric.factories import find_factory
from batchscore.models.numeric.features import feature_matrix
from batchscore.models.numeric.formats import detect
from batchscore.models.tensor import TensorTask, check_tensor_model
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.precision.int8_linear import int8_available
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job

FEATURES = ("x0", "x1", "x2", "x3")
MLP_ARGS = {"in_features": 4, "out_features": 3, "hidden": [8]}


def options(**keys) -> TensorConfig:
    return TensorConfig(**{"output": "class", **keys})


def make_task(path: Path, features=FEATURES, **keys) -> TensorTask:
    model = ModelConfig(task="tensor", precision="fp32", path=str(path), threads=1)
    inp = InputConfig(path=(), features=features)
    return TensorTask(path, model=model, options=options(**keys), inp=inp, executor=Executor(model))


def score(task: TensorTask, table: pa.Table, max_rows: int = 7):
    encoded = task.encode(table)
    batches = form_batches(encoded.lengths, 1 << 20, max_rows, sort=task.bucketing)
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return encoded, batches, task.finish(encoded, results)


def random_table(rows: int = 30) -> tuple[pa.Table, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32) * 3
    return pa.table({f"x{j}": x[:, j] for j in range(4)}), x


# -- features ---------------------------------------------------------------------------------


def test_scalar_columns_become_a_matrix_and_bad_rows_errors():
    table = pa.table(
        {
            "a": pa.array([1, 2, None, 4, 5], pa.int32()),
            "b": pa.array([0.5, math.nan, 1.0, None, math.inf]),
        }
    )
    matrix, rows, errors = feature_matrix(table, ("a", "b"), None)
    assert rows.tolist() == [0] and matrix.tolist() == [[1.0, 0.5]] and matrix.dtype == np.float32
    assert errors == {
        1: "column 'b': NaN or inf",
        2: "column 'a': value is null",
        3: "column 'b': value is null",
        4: "column 'b': NaN or inf",
    }


def test_one_list_column_is_a_vector_per_row():
    values = [[1, 2, 3], None, [1, 2], [1, None, 3], [4.0, math.nan, 6], [7, 8, 9]]
    table = pa.table({"v": pa.array(values, pa.list_(pa.float64()))})
    matrix, rows, errors = feature_matrix(table, ("v",), 3)
    assert rows.tolist() == [0, 5] and matrix.tolist() == [[1, 2, 3], [7, 8, 9]]
    assert errors == {
        1: "column 'v': value is null",
        2: "column 'v': expected 3 values",
        3: "column 'v': holds a null",
        4: "column 'v': holds NaN or inf",
    }
    with pytest.raises(InputDataError, match="num_features"):
        feature_matrix(table, ("v",), None)  # lists of any length: the width must be given
    fixed = pa.table({"v": pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int64(), 2))})
    matrix, rows, errors = feature_matrix(fixed, ("v",), None)  # the type says the width
    assert matrix.tolist() == [[1, 2], [3, 4]] and errors == {1: "column 'v': value is null"}


def test_a_list_column_must_be_the_only_feature():
    table = pa.table({"a": [1.0], "v": pa.array([[1.0]], pa.list_(pa.float64()))})
    with pytest.raises(InputDataError, match="must be the only feature"):
        feature_matrix(table, ("a", "v"), None)


# -- formats ----------------------------------------------------------------------------------


def test_formats_are_told_apart_by_content(mlp, tmp_path):
    _, files = mlp
    assert {name: detect(files[name]) for name in files} == {
        "torchscript": "torchscript",
        "export": "export",
        "safetensors": "safetensors",
        "pickle": "pickle",
    }
    (tmp_path / "model.safetensors").write_text("not a model")
    with pytest.raises(ModelError, match=r"not a safetensors, TorchScript or torch\.export"):
        detect(tmp_path / "model.safetensors")


@pytest.mark.parametrize("fmt", ["torchscript", "export", "safetensors"])
def test_every_format_scores_like_the_module(mlp, fmt):
    module, files = mlp
    keys = {"factory": "mlp", "factory_args": MLP_ARGS} if fmt == "safetensors" else {}
    task = make_task(files[fmt], **keys)
    table, x = random_table()
    _, batches, columns = score(task, table)
    assert [len(b) for b in batches] == [7, 7, 7, 7, 2]  # by max_rows, in input order
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    scores = np.array(columns["scores"].to_pylist(), dtype=np.float32)
    assert np.allclose(scores, expected, atol=1e-6)
    assert columns["prediction"].type == pa.int64()
    assert columns["prediction"].to_pylist() == expected.argmax(axis=1).tolist()


def test_a_pickle_is_never_loaded(mlp):
    _, files = mlp
    with pytest.raises(ModelError, match="pickle, which can run code"):
        make_task(files["pickle"])
    with pytest.raises(ModelError, match="pickle, which can run code"):
        check_tensor_model(files["pickle"], options())


def test_an_export_archive_with_pickled_payloads_is_refused(mlp, tmp_path):
    _, files = mlp
    tampered = tmp_path / "tampered.bin"
    with zipfile.ZipFile(files["export"]) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["use_pickle"] = True
                data = json.dumps(config).encode()
            dst.writestr(item, data)
    with pytest.raises(ModelError, match="stored as a pickle"):
        check_tensor_model(tampered, options())


def test_safetensors_need_a_factory_that_fits(mlp):
    _, files = mlp
    with pytest.raises(ModelError, match=r"need \[tensor\].factory"):
        make_task(files["safetensors"])
    with pytest.raises(ModelError, match='no factory "mpl" \\(did you mean "mlp"\\?\\)'):
        make_task(files["safetensors"], factory="mpl")
    with pytest.raises(ModelError, match=r"do not fit|size mismatch"):
        make_task(files["safetensors"], factory="mlp", factory_args={**MLP_ARGS, "hidden": [8, 8]})
    with pytest.raises(ModelError, match="unexpected keyword argument"):
        make_task(files["safetensors"], factory="mlp", factory_args={"in_features": 4, "x": 1})


def test_factories_registered_by_installed_packages_are_found(tmp_path, monkeypatch):
    package = tmp_path / "acme_models.py"
    package.write_text("import torch\ndef tiny(width):\n    return torch.nn.Linear(width, 1)\n")
    dist = tmp_path / "acme_models-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-models\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[batchscore.factories]\nacme-tiny = acme_models:tiny\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(find_factory("acme-tiny")(width=3), torch.nn.Linear)
    with pytest.raises(ModelError, match="acme-tiny"):
        find_factory("nope")  # the message lists what is known


def test_value_output_needs_one_number_per_row(mlp, tmp_path):
    _, files = mlp
    with pytest.raises(ModelError, match="one output per row; the model gives 3"):
        make_task(files["torchscript"], output="value")  # told at load, from one row of zeros
    regressor = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Flatten(0)))
    torch.jit.save(regressor, str(tmp_path / "regressor.pt"))
    table, x = random_table()
    _, _, columns = score(make_task(tmp_path / "regressor.pt", output="value"), table)
    assert columns["prediction"].type == pa.float32()
    with torch.inference_mode():
        assert np.allclose(
            columns["prediction"].to_numpy(), regressor(torch.from_numpy(x)), atol=1e-6
        )
    assert columns["scores"].to_pylist()[0] == [columns["prediction"][0].as_py()]


# -- jobs -------------------------------------------------------------------------------------


def tabular_shards(folder: Path, bad_row: int | None = None) -> None:
    """Three shards of 40 rows with 4 feature columns; optionally one null feature in shard 1."""
    folder.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(1).normal(size=(120, 4))
    for s in range(3):
        part = {f"x{j}": x[s * 40 : (s + 1) * 40, j].tolist() for j in range(4)}
        if bad_row is not None and s == 1:
            part["x2"][bad_row] = None
        ids = [f"row-{s * 40 + i}" for i in range(40)]
        pq.write_table(pa.table({"id": ids, **part}), folder / f"t-{s}.parquet", row_group_size=16)


def tensor_job(tmp_path: Path, model: Path) -> Path:
    return write_job(
        tmp_path / "tabular.toml",
        input={"path": "in", "id": "id", "features": list(FEATURES)},
        model={"task": "tensor", "path": str(model), "threads": 1},
        batching={"max_rows": 16, "window_rows": 32},
        output={"path": "out", "chunk_rows": 20},
        tensor={"output": "class", "factory": "mlp", "factory_args": MLP_ARGS},
    )


def test_tensor_job_runs_and_resumes(tmp_path, mlp):
    _, files = mlp
    tabular_shards(tmp_path / "in")
    job = load_job(tensor_job(tmp_path, files["safetensors"]))
    report = run_job(job)
    assert report["rows"] == 120 and report["chunks_committed"] == 6
    # windows span chunks and end at window_rows: 32+32+32+24 rows, two batches of 16 each
    assert report["batches"] == 4 * 2
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "prediction", "scores"]
    assert out["id"].to_pylist() == [f"row-{i}" for i in range(120)]
    again = run_job(job)
    assert again["rows"] == 0 and again["chunks_already_done"] == 6
    changed = load_job(job.source, ['input.features=["x3", "x2", "x1", "x0"]'])
    with pytest.raises(OutputConflictError):
        run_job(changed)  # the feature columns are part of the fingerprint


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_int8_quantizes_a_factory_model_and_refuses_torchscript(tmp_path, mlp):
    _, files = mlp
    tabular_shards(tmp_path / "in")
    sets = ["model.precision=int8", "quality.sample_rows=40"]
    report = run_job(load_job(tensor_job(tmp_path, files["safetensors"]), sets))
    assert report["precision"] == "int8" and report["rows"] == 120
    assert report["int8"].startswith("2 Linear layers in int8")
    assert report["settled"]["precision"]["agreement"]["prediction_agreement"] >= 0.95
    script = write_job(
        tmp_path / "script.toml",
        input={"path": "in", "id": "id", "features": list(FEATURES)},
        model={"task": "tensor", "path": str(files["torchscript"]), "threads": 1},
        output={"path": "script-out"},
        tensor={"output": "class"},
    )
    with pytest.raises(ModelError, match=r"no torch\.nn\.Linear layer to quantize"):
        run_job(load_job(script, sets))


def test_a_bad_row_fails_its_shard_naming_row_and_column(tmp_path, mlp):
    _, files = mlp
    tabular_shards(tmp_path / "in", bad_row=7)
    job = load_job(tensor_job(tmp_path, files["safetensors"]))
    with pytest.raises(InputDataError, match=r"t-1.parquet: row 7, column 'x2': value is null"):
        run_job(job)
    assert read_output(tmp_path / "out").num_rows == 80  # the other shards committed


def test_tensor_job_keys_are_checked(tmp_path, mlp):
    _, files = mlp
    tabular_shards(tmp_path / "in")
    path = tensor_job(tmp_path, files["safetensors"])
    with pytest.raises(JobError, match='output: expected one of class, value, got "argmax"'):
        load_job(path, ["tensor.output=argmax"])
    with pytest.raises(JobError, match=r"\[input\].features: task tensor needs"):
        load_job(path, ["input.features=[]"])
    with pytest.raises(JobError, match=r"\[tensor\].factory: a torchscript file holds its own"):
        load_job(path, ["tensor.format=torchscript"])
