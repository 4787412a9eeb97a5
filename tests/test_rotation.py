import math

import pytest
import torch

from kvbench.methods.torch.rotation import HaarRotation, SignedHadamard, fwht, make_rotation
from tests.plugins.tensors import randn


def _sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("n", [2**k for k in range(9)])
def test_fwht_is_the_sylvester_matrix(n):
    x = randn(3, 5, n, seed=n, dtype=torch.float64)
    expected = x @ _sylvester(n).T / math.sqrt(n)
    assert torch.allclose(fwht(x), expected, atol=1e-12)
    # The basis vectors give the matrix itself, column by column.
    assert torch.allclose(fwht(torch.eye(n, dtype=torch.float64)), _sylvester(n) / math.sqrt(n))


def test_fwht_is_its_own_inverse_and_keeps_dtype():
    x = randn(128, 64).T  # a non-contiguous input
    y = fwht(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.allclose(fwht(y), x, atol=1e-5)
    assert torch.equal(x, randn(128, 64).T)  # the input is left as it was


@pytest.mark.parametrize("n", [0, 3, 6, 96, 100])
def test_non_power_of_two_is_refused(n):
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(2, n))
    with pytest.raises(ValueError, match="power-of-two"):
        SignedHadamard(n)


@pytest.mark.parametrize("kind, dim", [("hadamard", 128), ("hadamard", 32), ("haar", 128),
                                       ("haar", 96)])
def test_rotations_are_orthogonal(kind, dim):
    rotation = make_rotation(kind, dim, seed=7)
    x = randn(500, dim, seed=1)
    y = rotation.forward(x)
    assert y.dtype == torch.float32
    assert torch.allclose(rotation.inverse(y), x, atol=1e-5)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert not torch.allclose(y, x, atol=1e-2)  # it does rotate
    # As a matrix: R R^T = I, and inverse is exactly the transpose of forward.
    eye = torch.eye(dim, dtype=torch.float64)
    matrix = rotation.forward(eye).T  # column j = R e_j
    assert torch.allclose(matrix @ matrix.T, eye, atol=1e-12)
    assert torch.allclose(rotation.inverse(eye).T, matrix.T, atol=1e-12)


def test_signed_hadamard_is_d2_h_d1():
    rotation = SignedHadamard(16, seed=3)
    assert set(rotation.d1.tolist()) == set(rotation.d2.tolist()) == {-1.0, 1.0}
    expected = torch.diag(rotation.d2) @ _sylvester(16) @ torch.diag(rotation.d1) / 4
    assert torch.allclose(rotation.forward(torch.eye(16, dtype=torch.float64)).T, expected)


def test_haar_has_the_sign_fix():
    # Raw QR of a Gaussian leans Q's diagonal to one sign (LAPACK's convention; about -0.2 on
    # average at dim 8); with the fix its mean over many seeds is near zero.
    diag = torch.stack([torch.diagonal(HaarRotation(8, seed=s).matrix) for s in range(400)])
    assert diag.mean().abs() < 0.05


@pytest.mark.parametrize("kind", ["hadamard", "haar"])
def test_seeds_reproducible_and_distinct(kind):
    x = randn(4, 64)
    a, b, c = (make_rotation(kind, 64, seed=s).forward(x) for s in (0, 0, 1))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c, atol=1e-3)


def test_rotation_seed_is_independent_of_the_global_rng():
    torch.manual_seed(0)
    a = SignedHadamard(64, seed=5).d1
    torch.manual_seed(123)
    assert torch.equal(SignedHadamard(64, seed=5).d1, a)


def test_unknown_rotation_is_refused():
    with pytest.raises(ValueError, match="rotation"):
        make_rotation("givens", 64)


@pytest.mark.slow
def test_fwht_speed(benchmark):
    x = randn(65536, 128)
    y = benchmark(fwht, x)
    assert y.shape == x.shape


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hadamard", "haar"])
def test_rotation_speed(benchmark, kind):
    """What the codecs run: butterflies (hadamard) or one matrix product (haar) per call."""
    x = randn(65536, 128)
    rotation = make_rotation(kind, 128, seed=1)
    y = benchmark(rotation.forward, x)
    torch.testing.assert_close(rotation.inverse(y), x, atol=1e-4, rtol=1e-4)
