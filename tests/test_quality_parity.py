"""The quality and parity benchmarks on the tiny model: exact for identity, and they catch a
lossy cache and a cache that hands out wrong positions."""
import math
from dataclasses import dataclass

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.divergence import kl_divergence
from kvbench.benchmarks.specs.parity import Parity, ParityParams
from kvbench.benchmarks.specs.quality import Quality, QualityParams
from kvbench.methods import OnBackend, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.settings.base import MethodSettings, build_method
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.intq import IntQ
from kvbench.methods.torch.identity import CastCodec
from tests.plugins.model_runs import cpu_context

TINY = "tiny:llama"


def _quality(params, method):
    """Quality on the tiny model; `method` is settings (run as their torch implementation) or
    an implementation."""
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Quality).run(params, method, cpu_context(TINY))


def _parity(params, method):
    """Parity on the tiny model, as _quality."""
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Parity).run(params, method, cpu_context(TINY))


@dataclass
class _Plain(MethodSettings):
    """Settings with no fields, for the hand-written implementation below."""


class ShiftedPositions(Implementation):
    """Keeps everything but claims 5 more tokens than it saw: new tokens get wrong RoPE
    positions (the bug parity exists to catch)."""

    def __init__(self):
        super().__init__(_Plain(), OnBackend("torch"))

    def new_layer_cache(self, layer_idx):
        return _Shifted(CastCodec(), CastCodec(), 1 << 62, self.on.arrays)


class _Shifted(CodecCache):
    @property
    def seen_tokens(self):
        return self.retained_tokens + 5


QUALITY = QualityParams(context=64, continuation=24, greedy_tokens=12)
PARITY = ParityParams(context=37, steps=10)


def test_quality_of_identity_is_exact():
    out = _quality(QUALITY, Identity()).metrics
    assert out["top_k_overlap"].value == 1 and out["top1_agreement"].value == 1
    assert out["kl_plain_method"].value == pytest.approx(0, abs=1e-12)
    assert out["kl_method_plain"].value == pytest.approx(0, abs=1e-12)
    assert out["greedy_agreement"].value == 1 and out["greedy_prefix"].value == 1


def test_quality_orders_lossy_methods():
    four = _quality(QUALITY, IntQ(bits=4)).metrics
    two = _quality(QUALITY, IntQ(bits=2)).metrics
    assert 0 < four["kl_plain_method"].value < two["kl_plain_method"].value
    assert two["top_k_overlap"].value < four["top_k_overlap"].value < 1
    assert four["kl_method_plain"].value > 0


def test_parity_of_identity_holds_after_a_prefill_of_any_length():
    for context in (1, 37, 100):
        out = _parity(ParityParams(context=context, steps=6), Identity())
        assert out.metrics["max_logit_diff"].value < 1e-4
        assert out.metrics["greedy_agreement"].value == 1
        assert out.metrics["first_divergence"].value == 6
        assert len(out.info["kl_per_step"]) == 6


def test_parity_catches_wrong_positions_and_reports_lossy_divergence():
    shifted = _parity(PARITY, ShiftedPositions()).metrics
    assert shifted["max_logit_diff"].value > 0.05
    assert shifted["mean_kl"].value > 1e-4
    lossy = _parity(PARITY, IntQ(bits=2))
    assert lossy.metrics["max_kl"].value >= lossy.metrics["mean_kl"].value > 0
    assert max(lossy.info["kl_per_step"]) == pytest.approx(lossy.metrics["max_kl"].value, rel=1e-4)


def test_parity_holds_after_the_cache_is_rewound():
    out = _parity(ParityParams(context=40, steps=6, trim=13), Identity())
    assert out.metrics["max_logit_diff"].value < 1e-4
    assert out.metrics["greedy_agreement"].value == 1


def test_a_cache_that_cannot_rewind_refuses():
    with pytest.raises(ValueError, match="can take back only 0 of the 13"):
        _parity(ParityParams(context=40, steps=6, trim=13), IntQ(bits=4))


def test_parity_feeds_the_methods_reference_probe():
    """am with `queries: repeat` compacts with the prompt's queries fed again as its probe: parity
    feeds it (and takes it back) as the other benchmarks do, before and after a rewind."""
    repeat = implementation(build_method("am", {"ratio": 0.5, "queries": "repeat"}))
    out = _parity(PARITY, repeat).metrics
    assert all(math.isfinite(metric.value) for metric in out.values())
    assert out["mean_kl"].value > 0  # half the prompt is gone
    plain = _parity(PARITY, build_method("am", {"ratio": 0.5})).metrics
    assert out["mean_kl"].value != plain["mean_kl"].value  # the probe's queries were used
    rewound = _parity(ParityParams(context=37, steps=10, trim=5), repeat).metrics
    assert rewound["mean_kl"].value == pytest.approx(out["mean_kl"].value, rel=1e-3)


def test_kl_divergence_is_the_formula():
    generator = torch.Generator().manual_seed(0)
    p_logits = torch.randn(5, 7, 33, generator=generator) * 3
    q_logits = torch.randn(5, 7, 33, generator=generator) * 3
    p, q = p_logits.double().softmax(-1), q_logits.double().softmax(-1)
    expected = (p * (p / q).log()).sum(-1)
    got = kl_divergence(p_logits, q_logits)
    assert got.dtype == torch.float64 and got.shape == (5, 7)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert kl_divergence(p_logits, p_logits).abs().max() == 0
    # a masked key (-inf in both) adds nothing; mass where q has none makes it infinite
    masked_p, masked_q = p_logits.clone(), q_logits.clone()
    masked_p[..., :4] = masked_q[..., :4] = -math.inf
    p4, q4 = masked_p.double().softmax(-1), masked_q.double().softmax(-1)
    expected = (p4[..., 4:] * (p4[..., 4:] / q4[..., 4:]).log()).sum(-1)
    torch.testing.assert_close(kl_divergence(masked_p, masked_q), expected, rtol=1e-10, atol=1e-12)
    assert kl_divergence(p_logits, masked_q).isinf().all()
