"""Packed float32 Linear layers: the same numbers as ``F.linear``, the same module to everything
that holds or walks it (state dict, tied weights, int8's swap), and a fallback whenever the
packed copy no longer matches the weight's dtype or device."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from batchscore.job.sections import ModelConfig
from batchscore.runtime.executor import Executor
from batchscore.runtime.packing import PackedLinear, pack_linears, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN")


class Scaled(nn.Linear):
    """A Linear subclass whose forward does more than a Linear: left as it is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), Scaled(64, 64), nn.Linear(64, 8, bias=False))


def test_float32_linears_are_packed_and_score_as_before():
    module, x = model().eval(), torch.randn(3, 5, 32)  # a batch of sequences, as encoders see
    before, keys = module(x), list(module.state_dict())
    assert pack_linears(module) == 2
    assert [type(m).__name__ for m in module] == ["PackedLinear", "GELU", "Scaled", "PackedLinear"]
    assert list(module.state_dict()) == keys  # the packed copies are no state
    torch.testing.assert_close(module(x), before, atol=1e-5, rtol=1e-5)
    assert module(torch.empty(0, 32)).shape == (0, 8)


def test_tied_weights_stay_one_parameter():
    first, second = nn.Linear(16, 16), nn.Linear(16, 16)
    second.weight = first.weight
    module = nn.Sequential(first, second)
    pack_linears(module)
    assert module[0].weight is module[1].weight and isinstance(module[1], PackedLinear)


def test_copies_and_pickles_pack_their_own_weights():
    module, x = model().eval(), torch.randn(4, 32)
    pack_linears(module)
    for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert isinstance(other[0], PackedLinear)
        assert other[0].weight is not module[0].weight and other[0].packed is not module[0].packed
        torch.testing.assert_close(other(x), module(x))


def test_a_weight_changed_after_packing_is_packed_again():
    module, x = model().eval(), torch.randn(4, 32)
    pack_linears(module)
    layer = module[0]
    with torch.no_grad():
        layer.weight.mul_(-2)  # in place
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    layer.weight = nn.Parameter(torch.randn(64, 32))  # replaced
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_a_cast_after_packing_runs_on_the_cast_weight():
    module, x = model().eval(), torch.randn(4, 32)
    pack_linears(module)
    module.to(torch.bfloat16)
    layer = module[0]
    out = layer(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x.bfloat16(), layer.weight, layer.bias))


def test_the_executor_packs_fp32_cpu_models_only_when_not_compiling():
    eager = Executor(ModelConfig(task="embed", device="cpu", precision="fp32"))
    assert isinstance(eager.prepare(model())[0], PackedLinear)
    compiling = Executor(ModelConfig(task="embed", device="cpu", precision="fp32", compile=True))
    compiling.prepare(model())
    assert type(compiling.prepared[-1][0]) is nn.Linear  # inductor packs on its own


def test_greedy_generation_is_unchanged_by_packing():
    torch.manual_seed(0)
    config = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512,
                      decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)  # fmt: skip
    eager = T5ForConditionalGeneration(config).eval()
    packed = copy.deepcopy(eager)
    assert pack_linears(packed) > 0
    ids = torch.randint(2, 512, (4, 12))
    settings = {"max_new_tokens": 16, "do_sample": False, "num_beams": 1}
    with torch.inference_mode():
        want = eager.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        got = packed.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    assert torch.equal(got, want)
