import math

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.proofs import Proofs, ProofsParams
from kvbench.data.synthetic import make_vectors
from kvbench.methods import METHODS, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.settings.lloydmax import LloydMax
from kvbench.methods.torch.codebooks import lloyd_max
from tests.plugins.model_runs import cpu_context
from tests.plugins.tensors import randn, round_trip


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


def test_registered_by_name():
    assert METHODS.get("lloydmax") is LloydMax


def test_100_bytes_per_256_dim_vector_at_3_bits():
    codec = implementation(LloydMax()).codec()
    assert codec.nbytes(codec.encode(randn(1, 2, 10, 256))) == 2 * 10 * 100


@pytest.mark.parametrize("bits, dim", [(1, 7), (2, 130), (3, 13), (3, 64), (4, 33), (5, 100),
                                       (7, 9), (8, 64)])
def test_nbytes_is_norm_plus_packed_codes_per_vector(bits, dim):
    codec = implementation(LloydMax(bits=bits)).codec()
    packed = codec.encode(randn(2, 3, 5, dim))
    assert set(packed.tensors) == {"codes", "norms"}
    assert packed.tensors["codes"].dtype == torch.uint8
    assert packed.tensors["codes"].shape == (2, 3, 5, math.ceil(bits * dim / 8))
    assert packed.tensors["norms"].dtype == torch.float32
    assert codec.nbytes(packed) == 2 * 3 * 5 * (4 + math.ceil(bits * dim / 8))


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_decode_is_the_manthanquant_formula(bits):
    dim = 96
    x = randn(1, 2, 20, dim, seed=bits) * 3
    x_hat = round_trip(LloydMax(bits=bits), x)
    # Written out independently: nearest centroid of x / ||x|| * sqrt(D), times ||x|| / sqrt(D).
    c = lloyd_max("gaussian", bits).centroids.float()
    r = x.norm(dim=-1, keepdim=True)
    nearest = c[(x / r * math.sqrt(dim))[..., None].sub(c).abs().argmin(-1)]
    assert torch.allclose(x_hat, nearest / math.sqrt(dim) * r, rtol=1e-5, atol=1e-6)
    # No norm correction: the decoded norm is the centroids' norm, not ||x||.
    assert not torch.allclose(x_hat.norm(dim=-1), x.norm(dim=-1), rtol=1e-3)


def test_cosine_on_gaussian_vectors_is_what_lloyd_max_predicts():
    x = make_vectors("gaussian", 4096, 256, seed=0).reshape(1, 1, 4096, 256)
    cosine = float(_cosine(round_trip(LloydMax(bits=3), x), x).mean())
    # E[s c(s)] = E[c^2] = 1 - mse at the Lloyd-Max optimum, so cosine ~ sqrt(1 - mse) ~ 0.9826;
    # measured 0.9828 (finite D: ||s||^2 = D exactly, not just on average).
    assert 0.975 < cosine < 0.99
    assert abs(cosine - math.sqrt(1 - lloyd_max("gaussian", 3).mse)) < 1e-3


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_rotation_rescues_outlier_channels(bits):
    x = make_vectors("outliers", 2048, 128, seed=1).reshape(1, 1, 2048, 128)
    plain = float((round_trip(LloydMax(bits=bits), x) - x).pow(2).mean())
    rotated = float((round_trip(LloydMax(bits=bits, rotate=True), x) - x).pow(2).mean())
    assert rotated < plain / 5


def test_rotation_is_orthogonal_and_seeded():
    dim = 64
    cpu = torch.device("cpu")
    q0 = implementation(LloydMax(rotate=True)).codec().rotation_matrix(dim, cpu).double()
    again = implementation(LloydMax(rotate=True, rotation_seed=0)).codec().rotation_matrix(dim, cpu)
    other = implementation(LloydMax(rotate=True, rotation_seed=1)).codec().rotation_matrix(dim, cpu)
    assert torch.allclose(q0 @ q0.T, torch.eye(dim, dtype=torch.float64), atol=1e-6)
    assert torch.equal(q0.float(), again)
    assert not torch.allclose(q0.float(), other, atol=0.1)
    # The rotation's generator is its own: drawing from the global RNG does not change it.
    torch.manual_seed(123)
    torch.randn(10)
    fresh = implementation(LloydMax(rotate=True)).codec()
    assert torch.equal(fresh.rotation_matrix(dim, cpu), again)


def test_rotation_round_trips_at_eight_bits():
    x = randn(1, 2, 50, 64, seed=4)
    x_hat = round_trip(LloydMax(bits=8, rotate=True, rotation_seed=7), x)
    assert _cosine(x_hat, x).min() > 0.9999


@pytest.mark.parametrize("rotate", [False, True])
def test_zero_vector_decodes_to_zeros(rotate):
    x = randn(1, 1, 6, 32)
    x[..., 2, :] = 0
    x_hat = round_trip(LloydMax(rotate=rotate), x)
    assert torch.isfinite(x_hat).all()
    assert (x_hat[..., 2, :] == 0).all()
    assert (x_hat[..., 3, :] != 0).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_decode_keeps_shape_and_dtype(dtype):
    x = randn(2, 2, 7, 48, dtype=dtype)
    x_hat = round_trip(LloydMax(), x)
    assert x_hat.shape == x.shape and x_hat.dtype == dtype
    assert _cosine(x_hat, x).mean() > 0.97


@pytest.mark.parametrize("rotate", [False, True])
def test_merge_decodes_like_the_parts(rotate):
    codec = implementation(LloydMax(bits=3, rotate=rotate)).codec()
    g = torch.Generator().manual_seed(3)
    parts = [codec.encode(torch.randn(1, 2, n, 40, generator=g)) for n in (5, 1, 3)]
    merged = codec.merge(parts)
    assert merged.shape == (1, 2, 9, 40)
    for name in ("codes", "norms"):
        assert torch.equal(merged.tensors[name], torch.cat([p.tensors[name] for p in parts], -2))
    decoded, expected = codec.decode(merged), torch.cat([codec.decode(p) for p in parts], -2)
    # The rotation's matmul may round differently for a different number of rows.
    tolerance = 1e-5 if rotate else 0.0
    torch.testing.assert_close(decoded, expected, rtol=tolerance, atol=tolerance)
    assert codec.nbytes(merged) == sum(codec.nbytes(p) for p in parts)


def test_cache_keeps_the_window_and_one_merged_block():
    window, dim = 4, 64
    cache = implementation(LloydMax(window=window)).new_layer_cache(0)
    assert isinstance(cache, CodecCache)
    keys, values = randn(1, 2, 30, dim, seed=1), randn(1, 2, 30, dim, seed=2)
    for start, stop in [(0, 11), (11, 12), (12, 30)]:  # a prefill, then uneven appends
        cache.append(keys[..., start:stop, :], values[..., start:stop, :])
        assert cache.retained_tokens == stop
    k_out, v_out, _ = cache.attention_inputs()
    assert len(cache._blocks()) == 1  # merged, so a read decodes (or attends over) one block
    assert torch.equal(k_out[..., -window:, :], keys[..., -window:, :])
    assert torch.equal(v_out[..., -window:, :], values[..., -window:, :])
    assert _cosine(k_out[..., :-window, :], keys[..., :-window, :]).min() > 0.95
    packed = 30 - window
    expected = 2 * 2 * packed * (4 + 3 * dim // 8) + 2 * 2 * window * dim * 4  # K and V
    assert cache.retained_bytes == expected


@pytest.mark.parametrize("field, value", [
    ("bits", 0), ("bits", 9), ("bits", 2.5), ("rotate", "yes"), ("rotate", 1),
    ("rotation_seed", -1), ("rotation_seed", 0.5), ("window", -1),
])
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        LloydMax(**{field: value})


def test_layout_names_the_layout():
    layout = implementation(LloydMax(bits=4, window=16)).layout()
    for part in ("4-bit", "float32 norm per vector", "sqrt(D)", "no rotation", "newest 16 tokens",
                 "K and V"):
        assert part in layout
    rotated = implementation(LloydMax(rotate=True, rotation_seed=5)).codec().layout()
    assert "seeded random rotation (seed 5" in rotated


def test_proofs_reports_the_upstream_ratio():
    out = measurement(Proofs).run(ProofsParams(dim=256, n_vectors=512),
                                  implementation(LloydMax()), cpu_context())
    # 512 B of 16-bit values against 4 + 96 B per vector.
    assert out.metrics["compression_ratio"].value == 5.12
    assert out.metrics["bits_per_value"].value == 3.125
    assert 0.975 < out.metrics["cosine"].value < 0.99
