"""Agreement between two scorings of the same rows, per output column, against the gate."""

from __future__ import annotations

import pyarrow as pa

from batchscore.config import QualityConfig
from batchscore.quality import measure

GATE = QualityConfig()


def test_vectors_by_cosine():
    ref = {"embedding": pa.array([[1.0, 0.0], [0.0, 1.0]])}
    close = {"embedding": pa.array([[0.999, 0.01], [0.0, 2.0]])}
    far = {"embedding": pa.array([[1.0, 0.0], [1.0, 1.0]])}
    assert measure(ref, close, GATE).passed
    bad = measure(ref, far, GATE)
    assert not bad.passed and abs(bad.metrics["cosine_min"] - 0.7071) < 1e-3
    assert bad.failures == ["cosine_min 0.7071 < 0.99"]


def test_labels_by_agreement_and_probability_change():
    ref = {"label": pa.array(["a", "b", "a", "a"]), "score": pa.array([0.9, 0.8, 0.7, 0.6])}
    cand = {"label": pa.array(["a", "b", "b", "a"]), "score": pa.array([0.9, 0.8, 0.55, 0.6])}
    result = measure(ref, cand, GATE)
    assert result.metrics["label_agreement"] == 0.75
    assert abs(result.metrics["max_probability_change"] - 0.15) < 1e-9
    assert not result.passed


def test_text_by_exact_match_and_overlap():
    ref = {"generated": pa.array(["the cat sat", "a dog", "yes"])}
    cand = {"generated": pa.array(["the cat sat", "a cat", "yes"])}
    result = measure(ref, cand, QualityConfig(min_exact_match=0.6))
    assert result.passed and abs(result.metrics["exact_match"] - 2 / 3) < 1e-9
    assert abs(result.metrics["token_overlap"] - (1 + 0.5 + 1) / 3) < 1e-9


def test_classes_and_values():
    classes = measure(
        {"prediction": pa.array([1, 2, 3])}, {"prediction": pa.array([1, 2, 0])}, GATE
    )
    assert classes.metrics["prediction_agreement"] == 2 / 3 and not classes.passed
    values = measure(
        {"prediction": pa.array([1.0, 2.0])}, {"prediction": pa.array([1.001, 2.0])}, GATE
    )
    assert values.passed and abs(values.metrics["max_relative_error"] - 0.001) < 1e-9


def test_no_rows_nothing_to_fail():
    assert measure({"embedding": pa.array([], pa.list_(pa.float32()))}, {}, GATE).passed
