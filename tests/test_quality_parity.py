"""The quality and parity benchmarks on the tiny model: exact for identity, and they catch a
lossy cache and a cache that hands out wrong positions."""
import pytest
import torch

from kvbench.benchmarks.base import RunContext
from kvbench.benchmarks.parity import Parity, ParityParams
from kvbench.benchmarks.quality import Quality, QualityParams
from kvbench.methods.base import Method
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.identity import CastCodec, Identity
from kvbench.methods.intq import IntQ
from kvbench.models import load_model


def _ctx():
    return RunContext(device=torch.device("cpu"), seed=0, repeats=1, model="tiny:llama",
                      load_model=lambda spec, device, backend="torch": load_model(spec, device))


class ShiftedPositions(Method):
    """Keeps everything but claims 5 more tokens than it saw: new tokens get wrong RoPE
    positions (the bug parity exists to catch)."""

    def new_layer_cache(self, layer_idx):
        return _Shifted(CastCodec(), CastCodec(), window=1 << 62)


class _Shifted(CodecCache):
    @property
    def seen_tokens(self):
        return self.retained_tokens + 5


QUALITY = QualityParams(context=64, continuation=24, greedy_tokens=12)
PARITY = ParityParams(context=37, steps=10)


def test_quality_of_identity_is_exact():
    out = Quality().run(QUALITY, Identity(), _ctx()).metrics
    assert out["top_k_overlap"].value == 1 and out["top1_agreement"].value == 1
    assert out["kl_plain_method"].value == pytest.approx(0, abs=1e-12)
    assert out["kl_method_plain"].value == pytest.approx(0, abs=1e-12)
    assert out["greedy_agreement"].value == 1 and out["greedy_prefix"].value == 1


def test_quality_orders_lossy_methods():
    four = Quality().run(QUALITY, IntQ(bits=4), _ctx()).metrics
    two = Quality().run(QUALITY, IntQ(bits=2), _ctx()).metrics
    assert 0 < four["kl_plain_method"].value < two["kl_plain_method"].value
    assert two["top_k_overlap"].value < four["top_k_overlap"].value < 1
    assert four["kl_method_plain"].value > 0


def test_parity_of_identity_holds_after_a_prefill_of_any_length():
    for context in (1, 37, 100):
        out = Parity().run(ParityParams(context=context, steps=6), Identity(), _ctx())
        assert out.metrics["max_logit_diff"].value < 1e-4
        assert out.metrics["greedy_agreement"].value == 1
        assert out.metrics["first_divergence"].value == 6
        assert len(out.info["kl_per_step"]) == 6


def test_parity_catches_wrong_positions_and_reports_lossy_divergence():
    shifted = Parity().run(PARITY, ShiftedPositions(), _ctx()).metrics
    assert shifted["max_logit_diff"].value > 0.05
    assert shifted["mean_kl"].value > 1e-4
    lossy = Parity().run(PARITY, IntQ(bits=2), _ctx())
    assert lossy.metrics["max_kl"].value >= lossy.metrics["mean_kl"].value > 0
    assert max(lossy.info["kl_per_step"]) == pytest.approx(lossy.metrics["max_kl"].value, rel=1e-4)


def test_parity_holds_after_the_cache_is_rewound():
    out = Parity().run(ParityParams(context=40, steps=6, trim=13), Identity(), _ctx())
    assert out.metrics["max_logit_diff"].value < 1e-4
    assert out.metrics["greedy_agreement"].value == 1


def test_a_cache_that_cannot_rewind_refuses():
    with pytest.raises(ValueError, match="can take back only 0 of the 13"):
        Parity().run(ParityParams(context=40, steps=6, trim=13), IntQ(bits=4), _ctx())
