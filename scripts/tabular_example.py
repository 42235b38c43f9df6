"""Build the example for jobs/tabular.toml: a small real data set as shards, and a model for it.

The data is scikit-learn's bundled copy of the Wisconsin breast-cancer data (569 tumours, 30
measurements each, diagnosis malignant or benign; nothing is downloaded), written as Parquet
shards with the measurements in one fixed-size list column. The model is batchscore's built-in
``mlp`` factory (standardise, one hidden layer) trained for a second on a random 75% of the rows
(the ``split`` column says which) and saved as safetensors; its held-out accuracy is printed.

    python scripts/tabular_example.py data/tabular models/breast-cancer-mlp.safetensors
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

CLASSES = ["malignant", "benign"]  # scikit-learn's target order: prediction 0 or 1
HIDDEN = [16]


def dataset(seed: int = 0) -> pa.Table:
    """sample_id, measurements (30 float32), diagnosis, split (train | test)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = data.data.astype(np.float32), data.target
    split = np.where(np.random.default_rng(seed).random(len(y)) < 0.75, "train", "test")
    flat = pa.array(x.reshape(-1), type=pa.float32())
    return pa.table(
        {
            "sample_id": [f"tumour-{i:03d}" for i in range(len(y))],
            "measurements": pa.FixedSizeListArray.from_arrays(flat, x.shape[1]),
            "diagnosis": [CLASSES[t] for t in y],
            "split": split.tolist(),
        }
    )


def train(table: pa.Table, epochs: int = 300, seed: int = 0) -> tuple[torch.nn.Module, float]:
    """The MLP trained on the train rows, and its accuracy on the test rows."""
    from batchscore.models.numeric.factories import mlp

    x = torch.from_numpy(np.stack(table.column("measurements").to_numpy(zero_copy_only=False)))
    y = torch.tensor([CLASSES.index(d) for d in table.column("diagnosis").to_pylist()])
    train_rows = torch.tensor([s == "train" for s in table.column("split").to_pylist()])
    torch.manual_seed(seed)
    model = mlp(x.shape[1], len(CLASSES), HIDDEN)
    with torch.no_grad():
        model.mean.copy_(x[train_rows].mean(dim=0))
        model.scale.copy_(x[train_rows].std(dim=0).clamp(min=1e-6))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(epochs):
        loss = torch.nn.functional.cross_entropy(model(x[train_rows]), y[train_rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        test = ~train_rows
        accuracy = (model(x[test]).argmax(dim=1) == y[test]).float().mean().item()
    return model.eval(), accuracy


def build(data: Path, model_file: Path, shards: int = 2, epochs: int = 300) -> tuple[int, float]:
    """Write the shards and the trained model; return the row count and held-out accuracy."""
    from safetensors.torch import save_file

    table = dataset()
    data.mkdir(parents=True, exist_ok=True)
    size = -(-table.num_rows // shards)
    for i in range(shards):
        pq.write_table(table.slice(i * size, size), data / f"cancer-{i:03d}.parquet")
    model, accuracy = train(table, epochs)
    model_file.parent.mkdir(parents=True, exist_ok=True)
    factory_args = {"in_features": 30, "out_features": len(CLASSES), "hidden": HIDDEN}
    metadata = {
        "factory": "mlp",
        "factory_args": json.dumps(factory_args),
        "classes": "|".join(CLASSES),
    }
    save_file(model.state_dict(), str(model_file), metadata=metadata)
    return table.num_rows, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="folder for the Parquet shards")
    parser.add_argument("model", type=Path, help="the .safetensors file to write")
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a model this small trains fastest without thread synchronisation
    rows, accuracy = build(args.data, args.model, args.shards)
    print(
        f"wrote {rows} tumours in {args.shards} shards to {args.data} and an MLP to "
        f"{args.model} (held-out accuracy {accuracy:.3f})"
    )


if __name__ == "__main__":
    main()
