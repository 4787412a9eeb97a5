"""The quality and parity benchmarks on the tiny model: exact for identity, and they catch a
lossy cache and a cache that hands out wrong positions."""
import math

import pytest
import torch

from kvbench.benchmarks.divergence import kl_divergence
from kvbench.benchmarks.parity import Parity, ParityParams
from kvbench.benchmarks.quality import Quality, QualityParams
from kvbench.methods.base import Method, build_method
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.identity import CastCodec, Identity
from kvbench.methods.intq import IntQ
from tests.plugins.model_runs import cpu_context

TINY = "tiny:llama"


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
    out = Quality().run(QUALITY, Identity(), cpu_context(TINY)).metrics
    assert out["top_k_overlap"].value == 1 and out["top1_agreement"].value == 1
    assert out["kl_plain_method"].value == pytest.approx(0, abs=1e-12)
    assert out["kl_method_plain"].value == pytest.approx(0, abs=1e-12)
    assert out["greedy_agreement"].value == 1 and out["greedy_prefix"].value == 1


def test_quality_orders_lossy_methods():
    four = Quality().run(QUALITY, IntQ(bits=4), cpu_context(TINY)).metrics
    two = Quality().run(QUALITY, IntQ(bits=2), cpu_context(TINY)).metrics
    assert 0 < four["kl_plain_method"].value < two["kl_plain_method"].value
    assert two["top_k_overlap"].value < four["top_k_overlap"].value < 1
    assert four["kl_method_plain"].value > 0


def test_parity_of_identity_holds_after_a_prefill_of_any_length():
    for context in (1, 37, 100):
        out = Parity().run(ParityParams(context=context, steps=6), Identity(), cpu_context(TINY))
        assert out.metrics["max_logit_diff"].value < 1e-4
        assert out.metrics["greedy_agreement"].value == 1
        assert out.metrics["first_divergence"].value == 6
        assert len(out.info["kl_per_step"]) == 6


def test_parity_catches_wrong_positions_and_reports_lossy_divergence():
    shifted = Parity().run(PARITY, ShiftedPositions(), cpu_context(TINY)).metrics
    assert shifted["max_logit_diff"].value > 0.05
    assert shifted["mean_kl"].value > 1e-4
    lossy = Parity().run(PARITY, IntQ(bits=2), cpu_context(TINY))
    assert lossy.metrics["max_kl"].value >= lossy.metrics["mean_kl"].value > 0
    assert max(lossy.info["kl_per_step"]) == pytest.approx(lossy.metrics["max_kl"].value, rel=1e-4)


def test_parity_holds_after_the_cache_is_rewound():
    out = Parity().run(ParityParams(context=40, steps=6, trim=13), Identity(), cpu_context(TINY))
    assert out.metrics["max_logit_diff"].value < 1e-4
    assert out.metrics["greedy_agreement"].value == 1


def test_a_cache_that_cannot_rewind_refuses():
    with pytest.raises(ValueError, match="can take back only 0 of the 13"):
        Parity().run(ParityParams(context=40, steps=6, trim=13), IntQ(bits=4), cpu_context(TINY))


def test_parity_feeds_the_methods_reference_probe():
    """am with `queries: repeat` compacts with the prompt's queries fed again as its probe: parity
    feeds it (and takes it back) as the other benchmarks do, before and after a rewind."""
    repeat = build_method("am", {"ratio": 0.5, "queries": "repeat"})
    out = Parity().run(PARITY, repeat, cpu_context(TINY)).metrics
    assert all(math.isfinite(metric.value) for metric in out.values())
    assert out["mean_kl"].value > 0  # half the prompt is gone
    plain = Parity().run(PARITY, build_method("am", {"ratio": 0.5}), cpu_context(TINY)).metrics
    assert out["mean_kl"].value != plain["mean_kl"].value  # the probe's queries were used
    rewound = Parity().run(ParityParams(context=37, steps=10, trim=5), repeat,
                           cpu_context(TINY)).metrics
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
