"""Blocked encode/decode of tokenwise codecs gives the same bytes and values as one block."""
import pytest
import torch

import kvbench.methods.torch.tokenwise as tokenwise
from kvbench.methods import METHODS, implementation
from tests.plugins.tensors import randn, round_trip


@pytest.mark.parametrize("name, params", [
    ("lloydmax", {"bits": 3}), ("turbo", {"bits": 3, "block": 32}),
    ("turbo", {"bits": 4, "qjl": True}), ("turbo", {"bits": 2, "block": 32, "outlier_fraction": 0.5}),
])
def test_blocks_change_nothing(name, params, monkeypatch):
    codec = implementation(METHODS.get(name)(**params)).codec()
    x = randn(1, 2, 23, 128, seed=2)
    whole = codec.encode(x)  # 23 tokens: one block at the default size
    monkeypatch.setattr(tokenwise, "TOKENS_PER_BLOCK", 5)  # five blocks, a ragged last one
    blocked = codec.encode(x)
    assert whole.tensors.keys() == blocked.tensors.keys() and blocked.shape == whole.shape
    for key in whole.tensors:
        assert torch.equal(whole.tensors[key], blocked.tensors[key]), key
    assert codec.nbytes(blocked) == codec.nbytes(whole)
    decoded = codec.decode(blocked)
    monkeypatch.setattr(tokenwise, "TOKENS_PER_BLOCK", 8192)
    if params.get("qjl"):
        # QJL decodes its residual through a dense projection: a matmul whose summation order
        # follows the batch shape (bit-equal on some CPUs, not on others). The codes are equal.
        torch.testing.assert_close(decoded, codec.decode(whole), rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(decoded, codec.decode(whole))


def test_blocked_dense_rotation_differs_only_by_matmul_rounding(monkeypatch):
    """A dense rotation is a matmul whose summation order follows the batch shape: blocks may
    move the last bits, never more."""
    method = METHODS.get("lloydmax")(bits=2, rotate=True)
    x = randn(1, 2, 23, 128, seed=2)
    whole = round_trip(method, x)
    monkeypatch.setattr(tokenwise, "TOKENS_PER_BLOCK", 5)
    torch.testing.assert_close(round_trip(method, x), whole, rtol=1e-4, atol=1e-4)
