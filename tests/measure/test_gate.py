"""Agreement between two scorings of the same rows, by each kind of measure, against the gate."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batchscore.job.parse import load_job
from batchscore.job.sections import QualityConfig
from batchscore.measure.gate import Trial, judge, trial
from batchscore.measure.load import job_sample
from batchscore.models import agreement
from batchscore.models.generate import AbstractiveSummarizeTask
from batchscore.models.source.locate import locate
from batchscore.models.tasks import TASKS
from tests.reliability import make_job

GATE = QualityConfig()


def test_vectors_by_cosine():
    ref = {"embedding": pa.array([[1.0, 0.0], [0.0, 1.0]])}
    close = {"embedding": pa.array([[0.999, 0.01], [0.0, 2.0]])}
    far = {"embedding": pa.array([[1.0, 0.0], [1.0, 1.0]])}
    assert agreement.vectors(ref, close, "embedding", GATE).passed
    bad = agreement.vectors(ref, far, "embedding", GATE)
    assert not bad.passed and abs(bad.metrics["cosine_min"] - 0.7071) < 1e-3
    assert bad.failures == ["cosine_min 0.7071 < 0.99"]


def test_labels_by_agreement_and_probability_change():
    ref = {"label": pa.array(["a", "b", "a", "a"]), "score": pa.array([0.9, 0.8, 0.7, 0.6])}
    cand = {"label": pa.array(["a", "b", "b", "a"]), "score": pa.array([0.9, 0.8, 0.55, 0.6])}
    result = agreement.labels(ref, cand, "score", GATE)
    assert result.metrics["label_agreement"] == 0.75
    assert abs(result.metrics["max_probability_change"] - 0.15) < 1e-9
    assert not result.passed


def test_text_by_exact_match_and_overlap():
    ref = {"generated": pa.array(["the cat sat", "a dog", "yes"])}
    cand = {"generated": pa.array(["the cat sat", "a cat", "yes"])}
    result = agreement.texts(ref, cand, "generated", QualityConfig(min_exact_match=0.6))
    assert result.passed and abs(result.metrics["exact_match"] - 2 / 3) < 1e-9
    assert abs(result.metrics["token_overlap"] - (1 + 0.5 + 1) / 3) < 1e-9


def test_classes_and_values():
    classes = agreement.classes(
        {"prediction": pa.array([1, 2, 3])}, {"prediction": pa.array([1, 2, 0])}, "prediction", GATE
    )
    assert classes.metrics["prediction_agreement"] == 2 / 3 and not classes.passed
    values = agreement.values(
        {"prediction": pa.array([1.0, 2.0])},
        {"prediction": pa.array([1.001, 2.0])},
        "prediction",
        GATE,
    )
    assert values.passed and abs(values.metrics["max_relative_error"] - 0.001) < 1e-9


def test_no_rows_nothing_to_fail():
    empty = Trial("fp32", {"embedding": pa.array([], pa.list_(pa.float32()))}, 0.0, 0, None, None)
    assert judge(empty, empty, GATE).passed


def test_every_task_declares_its_own_measure():
    """The gate asks the task; a task without a measure would pass the gate unchecked."""
    for task in [*TASKS.values(), AbstractiveSummarizeTask]:
        assert callable(getattr(task, "agreement", None)), task


def test_a_model_let_go_gives_its_gpu_memory_back_once_nothing_holds_it(monkeypatch):
    """The fp32 reference let go (`Trial.unload`) before the scoring model runs: its module is
    gone (reference cycles collected) by the time the GPU's cache is emptied. CUDA is faked
    (no GPU here): `empty_cache` records whether the module was still alive when called."""
    import weakref

    import torch

    from batchscore.job.sections import ModelConfig
    from batchscore.runtime.executor import Executor
    from tests.machines import gpu

    gpu(monkeypatch)
    executor = Executor(ModelConfig(task="embed", precision="fp32", device="cpu", threads=1))
    executor.device = torch.device("cuda")  # as a GPU run's executor holds it (faked)
    module = torch.nn.Linear(4, 4)
    module.me = [module]  # a cycle, as a model's hooks and closures make
    alive_at_empty: list[bool] = []
    held = weakref.ref(module)
    monkeypatch.setattr(
        torch.cuda, "empty_cache", lambda: alive_at_empty.append(held() is not None)
    )
    reference = Trial("fp32", {"embedding": pa.array([[1.0]])}, 0.1, 1, module, executor)
    del module
    reference.unload()
    assert alive_at_empty == [False] and reference.task is None and reference.columns


def test_the_gate_cuts_its_sample_as_the_run_cuts_its_rows(tmp_path, small_corpus):
    """`[batching].sort = false` holds for the gate's sample too: its rows run in input order,
    as the run's do, so the results the run adopts from it (`Trial.known`) and its padded
    tokens per row (which size the run's windows) are the run's own."""
    sets = ["batching.sort=false", "quality.sample_rows=24", 'model.runtime="torch"']
    job = load_job(make_job(tmp_path, small_corpus.slice(0, 40)), sets)
    model_path, table = locate(job.model), job_sample(job)
    ran = trial(job, model_path, "fp32", table=table, max_tokens=256, timed=False)
    assert len(ran.known.batches) > 1
    assert np.concatenate(ran.known.batches).tolist() == list(range(table.num_rows))
    ran.unload()
