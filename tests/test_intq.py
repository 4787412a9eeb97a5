import math

import pytest
import torch

from kvbench.kernels.formats import IntQFormat
from kvbench.methods import METHODS, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.settings.intq import IntQ
from kvbench.methods.torch.intq import IntQCodec
from tests.plugins.tensors import randn


def _expected_nbytes(shape, bits, group, axis):
    """Packed codes per row plus an fp16 scale and fp16 min per group."""
    *lead, tokens, dim = shape
    length = dim if axis == "token" else tokens
    rows = math.prod(lead) * (tokens if axis == "token" else dim)
    return rows * (math.ceil(length * bits / 8) + 4 * math.ceil(length / group))


def _rows(x, axis):
    return x if axis == "token" else x.transpose(-1, -2)


def _per_element(group_values, group, length):
    """(..., groups) -> (..., length): each element gets its group's value."""
    return group_values.repeat_interleave(group, dim=-1)[..., :length]


def test_registered_by_name():
    assert METHODS.get("intq") is IntQ


@pytest.mark.parametrize("axis", ["token", "channel"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_error_is_within_half_a_step(bits, axis):
    # 70 is two whole groups of 32 and a partial group of 6, on either axis.
    x = randn(2, 3, 70, 70, seed=bits) * 3 + 1
    codec = implementation(IntQ(bits=bits, group_size=32, axis=axis)).codec()
    packed = codec.encode(x)
    x_hat = codec.decode(packed)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype

    rows = _rows(x, axis)
    groups = [rows[..., i : i + 32] for i in range(0, 70, 32)]
    true_min = torch.stack([g.amin(-1) for g in groups], dim=-1)
    true_max = torch.stack([g.amax(-1) for g in groups], dim=-1)
    scale, zero = packed.tensors["scale"], packed.tensors["min"]
    assert scale.shape == zero.shape == (*rows.shape[:-1], 3)
    assert torch.equal(scale, ((true_max - true_min) / (2**bits - 1)).half())
    assert torch.equal(zero, true_min.half())
    # Half a step, plus what rounding the min to fp16 moved the grid by.
    bound = scale.float() / 2 + (true_min - zero.float()).abs()
    err = (_rows(x_hat, axis) - rows).abs()
    assert (err <= _per_element(bound, 32, 70) + 1e-5).all()
    assert err.max() > 0  # lossy, so the bound is not met trivially


@pytest.mark.parametrize("axis", ["token", "channel"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group", [1, 8, 32, 50])
@pytest.mark.parametrize("shape", [(1, 2, 64, 64), (2, 1, 40, 70), (1, 1, 3, 5)])
def test_nbytes_is_the_layout_formula(shape, group, bits, axis):
    codec = implementation(IntQ(bits=bits, group_size=group, axis=axis)).codec()
    packed = codec.encode(randn(*shape))
    # The packed form holds exactly the layout's tensors, so nbytes is what is stored.
    assert set(packed.tensors) == {"codes", "scale", "min"}
    assert packed.tensors["codes"].dtype == torch.uint8
    assert packed.tensors["scale"].dtype == packed.tensors["min"].dtype == torch.float16
    assert codec.nbytes(packed) == _expected_nbytes(shape, bits, group, axis)


def test_bits_per_value_is_bits_plus_32_over_group():
    x = randn(1, 4, 128, 128)
    for bits, group in [(2, 32), (4, 32), (4, 128), (8, 64)]:
        codec = implementation(IntQ(bits=bits, group_size=group)).codec()
        assert 8 * codec.nbytes(codec.encode(x)) / x.numel() == bits + 32 / group


def test_eight_bits_is_near_lossless():
    x = randn(1, 2, 256, 64, dtype=torch.float16)
    x_hat = implementation(IntQ(bits=8)).codec().decode(
        implementation(IntQ(bits=8)).codec().encode(x))
    x, x_hat = x.double(), x_hat.double()
    assert ((x_hat - x).pow(2).mean() / x.pow(2).mean()) < 1e-4
    assert torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).min() > 0.9999


def test_more_bits_less_error():
    x = randn(1, 2, 128, 64)
    errors = []
    for bits in (2, 4, 8):
        codec = implementation(IntQ(bits=bits)).codec()
        errors.append(float((codec.decode(codec.encode(x)) - x).pow(2).mean()))
    assert errors[0] > errors[1] > errors[2] > 0


@pytest.mark.parametrize("axis", ["token", "channel"])
def test_constant_input_decodes_exactly(axis):
    x = torch.full((1, 2, 64, 48), -1.375, dtype=torch.float16)
    codec = implementation(IntQ(bits=2, axis=axis)).codec()
    packed = codec.encode(x)
    assert (packed.tensors["scale"] == 0).all()
    assert torch.equal(codec.decode(packed), x)


def test_channel_axis_groups_over_tokens():
    # Each channel constant over the tokens, different across channels: per-channel groups
    # have zero range (exact), per-token groups span the channels (lossy).
    x = randn(1, 2, 1, 64, dtype=torch.float16).expand(1, 2, 96, 64).contiguous()
    channel = implementation(IntQ(axis="channel", group_size=32))
    token = implementation(IntQ(axis="token", group_size=32))
    assert channel.codec().token_block == 32 and token.codec().token_block == 1
    assert torch.equal(channel.codec().decode(channel.codec().encode(x)), x)
    assert not torch.equal(token.codec().decode(token.codec().encode(x)), x)


@pytest.mark.parametrize("axis, group", [("token", 32), ("channel", 8)])
def test_cache_window_stays_exact(axis, group):
    window, dim, bits = 5, 64, 2
    method = implementation(IntQ(bits=bits, group_size=group, axis=axis, window=window))
    cache = method.new_layer_cache(0)
    assert isinstance(cache, CodecCache)
    keys, values = randn(1, 2, 30, dim, seed=1), randn(1, 2, 30, dim, seed=2)
    for start, stop in [(0, 11), (11, 12), (12, 30)]:  # a prefill, then uneven appends
        cache.append(keys[..., start:stop, :], values[..., start:stop, :])
        assert cache.retained_tokens == stop
    k_out, v_out, bias = cache.attention_inputs()
    assert bias is None and k_out.shape == keys.shape

    # Tokens are packed in whole token blocks once they leave the window.
    raw = window + (30 - window) % method.codec().token_block
    packed = 30 - raw
    assert torch.equal(k_out[..., packed:, :], keys[..., packed:, :])
    assert torch.equal(v_out[..., packed:, :], values[..., packed:, :])
    assert not torch.equal(k_out[..., :packed, :], keys[..., :packed, :])
    assert (k_out[..., :packed, :] - keys[..., :packed, :]).abs().max() < 1.5

    # Every packed chunk here holds whole groups, so bytes add up per token.
    if axis == "token":
        per_token = math.ceil(dim * bits / 8) + 4 * math.ceil(dim / group)
        packed_bytes = 2 * packed * per_token
    else:
        packed_bytes = 2 * dim * packed // group * (math.ceil(group * bits / 8) + 4)
    expected = 2 * packed_bytes + 2 * 2 * raw * dim * 4  # K and V; raw tokens in float32
    assert cache.retained_bytes == expected


@pytest.mark.parametrize(
    "field, value",
    [("bits", 3), ("bits", 0), ("bits", 16), ("group_size", 0), ("group_size", -4),
     ("window", -1), ("axis", "x")],
)
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        IntQ(**{field: value})


def test_layout_names_the_layout():
    layout = implementation(IntQ(bits=2, group_size=64, axis="channel", window=128)).layout()
    for part in ("2-bit", "64", "channel", "fp16 scale+min", "newest 128 tokens", "K and V"):
        assert part in layout


@pytest.mark.parametrize("axis,group,bits", [("token", 32, 4), ("token", 24, 2), ("channel", 8, 2),
                                             ("channel", 4, 8)])
def test_merge_decodes_like_the_parts(axis, group, bits):
    codec = implementation(IntQ(bits=bits, group_size=group, axis=axis)).codec()
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(1, 2, group * n, 40, generator=g) for n in (3, 1, 2)]
    parts = [codec.encode(c) for c in chunks]
    merged = codec.merge(parts)
    assert merged is not None and merged.shape == (1, 2, group * 6, 40)
    expected = torch.cat([codec.decode(p) for p in parts], dim=-2)
    assert torch.equal(codec.decode(merged), expected)
    assert codec.nbytes(merged) == sum(codec.nbytes(p) for p in parts)


def test_channel_merge_refuses_parts_that_end_mid_byte():
    codec = implementation(IntQ(bits=2, group_size=3, axis="channel")).codec()
    parts = [codec.encode(torch.randn(1, 1, 3, 8)) for _ in range(2)]  # 3 tokens x 2 bits: 6 bits
    assert codec.merge(parts) is None


@pytest.mark.parametrize("axis", ["token", "channel"])
def test_encoding_in_row_blocks_matches_encoding_the_pieces(axis, monkeypatch):
    import kvbench.methods.torch.intq as intq_module

    monkeypatch.setattr(intq_module, "ROWS_PER_BLOCK", 5)  # many blocks, a ragged last one
    codec = implementation(IntQ(bits=4, group_size=8, axis=axis)).codec()
    x = randn(1, 3, 16, 12, seed=1)
    whole = codec.encode(x)
    pieces = codec.merge([codec.encode(x[..., :8, :]), codec.encode(x[..., 8:, :])])
    for name in whole.tensors:
        assert torch.equal(whole.tensors[name], pieces.tensors[name])
    assert torch.equal(codec.decode(whole), codec.decode(pieces))


def test_channel_axis_in_token_blocks_equals_one_pass():
    """Long inputs go through in tiles of tokens; the bytes are those of one pass over each
    channel's whole row."""
    codec = IntQCodec(IntQFormat(bits=2, group_size=32, axis="channel"))
    step = codec._token_step(128)
    x = randn(1, 2, 2 * step + 37, 128, dtype=torch.float16)
    packed = codec.encode(x)
    for head in range(2):
        codes, scale, zero = codec._encode_rows(x[0, head].T.contiguous())
        assert torch.equal(packed.tensors["codes"][0, head], codes)
        assert torch.equal(packed.tensors["scale"][0, head], scale)
        assert torch.equal(packed.tensors["min"][0, head], zero)
    decoded = codec.decode(packed)
    rows = codec._decode_rows(codes, scale, zero, x.shape[-2])
    assert torch.equal(decoded[0, 1], rows.T.to(x.dtype))
