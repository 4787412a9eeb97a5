import math

import numpy as np
import pytest
import torch

from kvbench.kernels.formats import packed_length
from kvbench.methods.torch.packing import pack_bits, unpack_bits

BITS = range(1, 9)


def _codes(shape, bits, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << bits, shape, generator=g, dtype=torch.int64).to(torch.uint8)


def _reference_pack(codes: torch.Tensor, bits: int) -> np.ndarray:
    """The bit stream written out one bit at a time, then numpy's little-endian packbits."""
    stream = [(int(c) >> k) & 1 for c in codes.tolist() for k in range(bits)]
    return np.packbits(np.array(stream, dtype=np.uint8), bitorder="little")


@pytest.mark.parametrize("bits", BITS)
def test_round_trip_is_exact_and_length_is_minimal(bits):
    for n in range(1, 1025):  # every length: byte and 8-code group edges and everything between
        codes = _codes((2, 3, n), bits, seed=n)
        packed = pack_bits(codes, bits)
        assert packed.dtype == torch.uint8
        assert packed.shape == (2, 3, math.ceil(n * bits / 8)) == (2, 3, packed_length(n, bits))
        assert torch.equal(unpack_bits(packed, bits, n), codes), (bits, n)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n", [1, 5, 8, 13, 64, 77])
def test_matches_a_bit_by_bit_reference(bits, n):
    codes = _codes((n,), bits, seed=bits * 1000 + n)
    assert np.array_equal(pack_bits(codes, bits).numpy(), _reference_pack(codes, bits))


@pytest.mark.parametrize(
    "bits, codes, expected",
    [
        # 1 = 001, 2 = 010, 3 = 011 -> stream bits 0..8: 1 0 0 0 1 0 1 1 0
        # byte 0 = 1 + 16 + 64 + 128 = 209; bit 8 is 0 -> byte 1 = 0
        (3, [1, 2, 3], [209, 0]),
        # 31 fills bits 0..4, 1 sets bit 5: 31 + 32 = 63; bits 6..9 are 0
        (5, [31, 1], [63, 0]),
        # one bit each: bits 0, 2, 3 of byte 0 (1 + 4 + 8 = 13), bit 0 of byte 1
        (1, [1, 0, 1, 1, 0, 0, 0, 0, 1], [13, 1]),
        # 0xA, 0x5 -> low nibble first: 0x5A
        (4, [10, 5], [0x5A]),
        # 7 bits: 127 fills bits 0..6, 1 sets bit 7 -> 255; 2 more codes of 0 -> 2 zero bytes
        (7, [127, 1, 0], [255, 0, 0]),
        (8, [0, 200, 255], [0, 200, 255]),
    ],
)
def test_known_examples(bits, codes, expected):
    codes = torch.tensor(codes, dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.tolist() == expected
    assert unpack_bits(packed, bits, len(codes)).tolist() == codes.tolist()


def test_bad_arguments_are_refused():
    codes = torch.tensor([1, 2, 3], dtype=torch.uint8)
    for bits in (0, 9):
        with pytest.raises(ValueError, match="bits"):
            pack_bits(codes, bits)
        with pytest.raises(ValueError, match="bits"):
            unpack_bits(codes, bits, 3)
    with pytest.raises(ValueError, match="uint8"):
        pack_bits(codes.long(), 3)
    with pytest.raises(ValueError, match="below"):
        pack_bits(torch.tensor([4], dtype=torch.uint8), 2)
    with pytest.raises(ValueError, match="take 2 bytes"):
        unpack_bits(torch.zeros(3, dtype=torch.uint8), 3, 3)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_pack_speed(benchmark, bits):
    codes = _codes((1 << 16, 128), bits)
    packed = benchmark(pack_bits, codes, bits)
    assert packed.shape == (1 << 16, 16 * bits)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_unpack_speed(benchmark, bits):
    codes = _codes((1 << 16, 128), bits)
    packed = pack_bits(codes, bits)
    assert torch.equal(benchmark(unpack_bits, packed, bits, 128), codes)
