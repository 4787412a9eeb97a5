import math

import pytest
import torch

from kvbench.methods.torch.codebooks import lloyd_max

# Max (1960), Table I: N(0, 1) Lloyd-Max quantizers.
GAUSSIAN_3BIT = [0.2451, 0.7560, 1.3440, 2.1520]
GAUSSIAN_MSE = {1: 0.3634, 2: 0.1175, 3: 0.03455, 4: 0.009497}


def _beta_pdf(t, dim):
    """Unnormalised density of one coordinate of a uniform unit vector in dim dimensions."""
    return (1 - t * t).clamp_min(0) ** ((dim - 3) / 2)


def test_gaussian_3bit_centroids_are_max_table():
    cb = lloyd_max("gaussian", 3)
    expected = torch.tensor([-c for c in reversed(GAUSSIAN_3BIT)] + GAUSSIAN_3BIT).double()
    assert torch.allclose(cb.centroids, expected, atol=1e-4)


@pytest.mark.parametrize("bits", sorted(GAUSSIAN_MSE))
def test_gaussian_mse_is_max_table(bits):
    assert abs(lloyd_max("gaussian", bits).mse - GAUSSIAN_MSE[bits]) < 1e-4


@pytest.mark.parametrize("density, bits, dim", [("gaussian", b, None) for b in range(1, 9)]
                         + [("beta", 3, 2), ("beta", 4, 16), ("beta", 2, 300)])
def test_shape_order_and_symmetry(density, bits, dim):
    cb = lloyd_max(density, bits, dim)
    assert cb.centroids.dtype == cb.boundaries.dtype == torch.float64
    assert cb.centroids.shape == (2**bits,) and cb.boundaries.shape == (2**bits - 1,)
    assert (cb.centroids.diff() > 0).all()
    assert torch.allclose(cb.centroids, -cb.centroids.flip(0), atol=1e-12)
    assert torch.equal(cb.boundaries, (cb.centroids[1:] + cb.centroids[:-1]) / 2)
    assert (cb.density, cb.bits, cb.dim) == (density, bits, dim)


@pytest.mark.parametrize("density, bits, dim", [("gaussian", 4, None), ("beta", 3, 4),
                                                ("beta", 2, 40)])
def test_centroids_are_conditional_means_and_mse_integrates(density, bits, dim):
    """Both Lloyd-Max conditions and .mse, by plain trapezoid integration over each cell in t."""
    cb = lloyd_max(density, bits, dim)
    pdf = (lambda t: torch.exp(-t * t / 2)) if density == "gaussian" else (
        lambda t: _beta_pdf(t, dim))
    support = 12.0 if density == "gaussian" else 1.0  # N(0, 1) mass past 12 is below 1e-32
    edges = [-support, *cb.boundaries.tolist(), support]
    cells = [torch.linspace(a, b, 100_001, dtype=torch.float64) for a, b in zip(edges, edges[1:])]
    total = sum(torch.trapezoid(pdf(t), t) for t in cells)
    mse = 0.0
    for t, c in zip(cells, cb.centroids):
        p = pdf(t) / total
        assert float(torch.trapezoid(t * p, t) / torch.trapezoid(p, t)) == pytest.approx(
            float(c), abs=1e-8)
        mse += float(torch.trapezoid((t - c) ** 2 * p, t))
    assert mse == pytest.approx(cb.mse, rel=1e-6)


@pytest.mark.parametrize("dim", [2, 3, 5, 64, 1024])
def test_beta_one_bit_centroid_is_mean_abs_coordinate(dim):
    # E|t| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)); MSE = E[t^2] - E|t|^2 = 1/d - E|t|^2.
    mean_abs = math.exp(math.lgamma(dim / 2) - math.lgamma((dim + 1) / 2)) / math.sqrt(math.pi)
    cb = lloyd_max("beta", 1, dim)
    assert cb.centroids.tolist() == pytest.approx([-mean_abs, mean_abs], rel=1e-12)
    assert cb.mse == pytest.approx(1 / dim - mean_abs**2, rel=1e-10)


@pytest.mark.parametrize("bits", [2, 5])
def test_beta_in_three_dimensions_is_the_uniform_quantizer(bits):
    # d = 3: a coordinate of a random unit vector is uniform on [-1, 1] (Archimedes).
    n = 2**bits
    cb = lloyd_max("beta", bits, 3)
    uniform = (2 * torch.arange(n, dtype=torch.float64) + 1) / n - 1
    assert torch.allclose(cb.centroids, uniform, atol=1e-11)
    assert cb.mse == pytest.approx((2 / n) ** 2 / 12, rel=1e-9)


@pytest.mark.parametrize("bits", range(1, 9))
def test_gaussian_d_is_gaussian_scaled(bits):
    unit, scaled = lloyd_max("gaussian", bits), lloyd_max("gaussian_d", bits, 128)
    assert torch.allclose(scaled.centroids, unit.centroids / math.sqrt(128), rtol=1e-15, atol=0)
    assert scaled.mse == pytest.approx(unit.mse / 128, rel=1e-15)


def _beta_gap(bits, dim):
    """Largest relative difference of the beta centroids and MSE from gaussian_d."""
    beta, gauss = lloyd_max("beta", bits, dim), lloyd_max("gaussian_d", bits, dim)
    return max(float((beta.centroids / gauss.centroids - 1).abs().max()),
               abs(beta.mse / gauss.mse - 1))


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_beta_approaches_gaussian_d_as_one_over_dim(bits):
    # The beta density has lighter tails (E[(sqrt(d) t)^4] = 3d / (d + 2)): the gap is O(1/d),
    # 0.9e-3 (1 bit) to 2.5e-3 (4 bits, whose outer centroids sit further out) at d = 1024.
    gap_1024, gap_4096 = _beta_gap(bits, 1024), _beta_gap(bits, 4096)
    assert gap_1024 < 3e-3
    assert 3.5 < gap_1024 / gap_4096 < 4.5


def test_beta_differs_visibly_in_few_dimensions():
    beta, gauss = lloyd_max("beta", 3, 4), lloyd_max("gaussian_d", 3, 4)
    assert _beta_gap(3, 4) > 0.2
    assert beta.mse < gauss.mse  # bounded support: an easier density to quantize
    assert beta.centroids[-1] < 1 < gauss.centroids[-1]  # the Gaussian's lies past the support


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("density, bits, dim", [("gaussian", 1, None), ("gaussian", 3, None),
                                                ("gaussian", 8, None), ("beta", 4, 8)])
def test_quantize_picks_the_nearest_centroid(density, bits, dim, dtype):
    cb = lloyd_max(density, bits, dim)
    g = torch.Generator().manual_seed(bits)
    scale = 1.5 * float(cb.centroids[-1])  # past the outer centroids too
    x = ((torch.rand(3, 50, 40, generator=g, dtype=torch.float64) * 2 - 1) * scale).to(dtype)
    idx = cb.quantize(x)
    assert idx.dtype == torch.uint8 and idx.shape == x.shape
    brute = (x.double()[..., None] - cb.centroids).abs().argmin(-1)
    assert torch.equal(idx.long(), brute)
    decoded = cb.dequantize(idx, torch.float64)
    assert decoded.dtype == torch.float64 and torch.equal(decoded, cb.centroids[brute])
    assert cb.dequantize(idx).dtype == torch.float32


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_empirical_mse_matches(bits):
    cb = lloyd_max("gaussian", bits)
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mse = float((cb.dequantize(cb.quantize(x), torch.float64) - x).pow(2).mean())
    assert mse == pytest.approx(cb.mse, rel=0.02)


def test_cache_returns_the_same_object():
    assert lloyd_max("gaussian", 3) is lloyd_max("gaussian", 3)
    assert lloyd_max("beta", 2, 64) is lloyd_max("beta", 2, 64)
    assert lloyd_max("beta", 2, 64) is not lloyd_max("beta", 2, 65)


@pytest.mark.parametrize("args, field", [
    (("gaussian", 0), "bits"), (("gaussian", 9), "bits"), (("gaussian", 2.0), "bits"),
    (("laplace", 3), "density"), (("beta", 3), "dim"), (("beta", 3, 1), "dim"),
    (("gaussian_d", 3, None), "dim"), (("gaussian_d", 3, 0), "dim"),
])
def test_invalid_arguments_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        lloyd_max(*args)


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_float32_quantize_matches_float64_even_next_to_boundaries(bits):
    book = lloyd_max("gaussian", bits)
    near = book.boundaries.float()
    edges = torch.cat([near, torch.nextafter(near, torch.tensor(math.inf)),
                       torch.nextafter(near, torch.tensor(-math.inf))])
    x = torch.cat([edges, torch.randn(10_000, generator=torch.Generator().manual_seed(0))])
    expected = torch.bucketize(x.double(), book.boundaries).to(torch.uint8)
    assert torch.equal(book.quantize(x), expected)
    assert torch.equal(book.quantize(x.half()), torch.bucketize(x.half().double(), book.boundaries).to(torch.uint8))
