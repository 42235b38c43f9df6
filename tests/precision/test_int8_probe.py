"""int8 rests on private oneDNN ops that a torch upgrade may drop or change: they are probed by
running them once, and a torch without working ones refuses int8 (exit 4) while "auto" skips it.

The ops' absence is simulated by swapping ``torch.ops.onednn`` for a namespace without them
(or with a broken one), and clearing the probe's cache on both sides of each test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from batchscore.errors import ModelError
from batchscore.precision.int8_linear import int8_available, int8_problem
from batchscore.precision.table import available, check_precision
from tests.commands import invoke
from tests.reliability import make_job

CPU = torch.device("cpu")


@pytest.fixture
def probe_again() -> Iterator[None]:
    int8_problem.cache_clear()
    yield
    int8_problem.cache_clear()  # the next test probes the real ops again


@pytest.fixture
def ops_gone(monkeypatch: pytest.MonkeyPatch, probe_again: None) -> None:
    monkeypatch.setattr(torch.ops, "onednn", SimpleNamespace())


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_the_real_ops_pass_the_probe(probe_again: None):
    assert int8_problem() is None and int8_available()
    assert "int8" in available(CPU)


def test_absent_ops_refuse_int8_naming_the_torch_version(ops_gone: None):
    problem = int8_problem()
    assert problem and "qlinear" in problem
    assert "int8" not in available(CPU)
    names_torch = re.escape(f"torch {torch.__version__}") + ".*qlinear"
    with pytest.raises(ModelError, match=names_torch) as caught:
        check_precision("int8", CPU)
    assert caught.value.exit_code == 4
    check_precision("auto", CPU)  # auto is still fine: it moves on to what works
    check_precision("fp32", CPU)


@pytest.mark.parametrize(
    "pointwise, says",
    [
        (lambda *args: (_ for _ in ()).throw(RuntimeError("unknown signature")), "RuntimeError"),
        (lambda q, *args: torch.zeros(q.shape[0], 8), "wrong results"),
    ],
    ids=["raises", "wrong"],
)
def test_a_broken_op_is_caught_by_running_it(monkeypatch, probe_again, pointwise, says):
    real = torch.ops.onednn
    fake = SimpleNamespace(qlinear_prepack=real.qlinear_prepack, qlinear_pointwise=pointwise)
    monkeypatch.setattr(torch.ops, "onednn", fake)
    assert says in (int8_problem() or "")
    assert not int8_available()


def test_probed_once(monkeypatch, probe_again):
    calls = []
    real = torch.ops.onednn

    def counted(*args):
        calls.append(1)
        return real.qlinear_pointwise(*args)

    fake = SimpleNamespace(qlinear_prepack=real.qlinear_prepack, qlinear_pointwise=counted)
    monkeypatch.setattr(torch.ops, "onednn", fake)
    for _ in range(3):
        int8_available()
    assert len(calls) == 1


def test_run_exits_4_and_auto_moves_on(ops_gone: None, tmp_path: Path, small_corpus):
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    result = invoke("run", str(job), "--set", "model.precision=int8")
    assert result.exit_code == 4, result.output
    assert f"torch {torch.__version__}" in result.stderr and "int8" in result.stderr
    sets = ["--set", "model.precision=auto", "--set", "quality.sample_rows=20"]
    checked = invoke("check", str(job), *sets)
    assert checked.exit_code == 0, checked.stderr
    assert re.search(r"fp32( on OpenVINO)?:", checked.output) and "int8" not in checked.output
