"""`speed`: how fast a codec encodes and decodes, against a plain memory copy of the same bytes.

Vectors (1, 1, n, dim) in `dtype` are encoded, decoded and copied (on torch, copy_ into one
buffer kept across repeats: one read and one write of the input, the memcpy baseline; on MLX a new
array) in every repeat, so each repeat's ratio to memcpy compares runs made moments apart on the
same, possibly noisy, machine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.benchmarks.base import (
    Benchmark,
    BenchmarkOutput,
    MetricSpec,
    RunContext,
    check_at_least,
    register_benchmark,
)
from kvbench.data.synthetic import KINDS, make_vectors
from kvbench.methods.base import Codec, Method, Packed
from kvbench.models.info import ModelInfo

_RAM_SHARE = 0.5  # refuse settings whose estimate is above this share of physical RAM


@dataclass
class SpeedParams:
    """Parameters of the speed benchmark.

    n_vectors: int = 1_000_000 — vectors encoded per call.
    dim: int = 128 — head_dim.
    dtype: "float16" | "bfloat16" | "float32" = "float16" — the input the cache would hold.
    data: "gaussian" | "sphere" | "outliers" = "gaussian" — synthetic vectors.
    chunk: int = 0 — 0 encodes all vectors in one call; else calls of this many vectors, which
        bounds the codec's temporaries (the timings then include the per-call overhead).
    data_seed: int = 0 — seed of the synthetic data.
    warmup: int = 1 — untimed rounds of encode, decode and copy before the timed ones.
    """

    n_vectors: int = 1_000_000
    dim: int = 128
    dtype: Literal["float16", "bfloat16", "float32"] = "float16"
    data: Literal["gaussian", "sphere", "outliers"] = "gaussian"
    chunk: int = 0
    data_seed: int = 0
    warmup: int = 1

    def __post_init__(self):
        if self.data not in KINDS:
            raise ValueError(f"data must be one of {sorted(KINDS)}, got {self.data!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_at_least(self, {"n_vectors": 1, "dim": 1, "chunk": 0, "warmup": 0})


def estimate_bytes(params: SpeedParams) -> int:
    """Rough peak memory of a run: six input-sized tensors (the input; packed, at most the
    input's size, and decoded, each twice while a repeat replaces the last one's; the copy) and
    float32 temporaries of one encode call (intq holds about three copies of what it encodes)."""
    values = params.n_vectors * params.dim
    block = min(params.chunk or params.n_vectors, params.n_vectors) * params.dim
    return 6 * values * DTYPES[params.dtype].itemsize + 3 * 4 * block


def _physical_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def encode_chunks(codec: Codec, x: torch.Tensor, chunk: int) -> list[Packed]:
    """x (..., n, dim) encoded whole (chunk 0) or in calls of `chunk` tokens."""
    step = chunk or x.shape[-2]
    return [codec.encode(x[..., i : i + step, :]) for i in range(0, x.shape[-2], step)]


def decode_chunks(codec: Codec, parts: list[Packed]) -> list[torch.Tensor]:
    return [codec.decode(p) for p in parts]


def decoded_shape(parts: list[torch.Tensor]) -> list[int]:
    """The shape the decoded chunks would have joined along tokens."""
    return [*parts[0].shape[:-2], sum(p.shape[-2] for p in parts), parts[0].shape[-1]]


@register_benchmark("speed")
class Speed(Benchmark):
    """Encode and decode throughput of a method's codec, and its ratio to a memory copy of the
    same bytes measured in the same repeat. Needs a method with a codec."""

    Params = SpeedParams
    backends = ("torch", "mlx")
    metrics = {
        "encode_vectors_s": MetricSpec("vectors/s", "higher", "vectors encoded per second",
                                       timing="absolute"),
        "decode_vectors_s": MetricSpec("vectors/s", "higher", "vectors decoded per second",
                                       timing="absolute"),
        "encode_gb_s": MetricSpec("GB/s", "higher", "input bytes encoded per second (1e9)",
                                  timing="absolute"),
        "decode_gb_s": MetricSpec("GB/s", "higher", "decoded output bytes per second (1e9)",
                                  timing="absolute"),
        "memcpy_gb_s": MetricSpec("GB/s", "none", "input bytes copied per second (1e9)",
                                  timing="absolute"),
        "encode_vs_memcpy": MetricSpec("x", "higher", "encode GB/s / memcpy GB/s, per repeat",
                                       timing="ratio"),
        "decode_vs_memcpy": MetricSpec("x", "higher", "decode GB/s / memcpy GB/s, per repeat",
                                       timing="ratio"),
        "nbytes": MetricSpec("bytes", "none", "codec bytes of all vectors"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit bytes / codec bytes"),
    }

    def check(self, params: SpeedParams, model: ModelInfo | None) -> None:
        need, ram = estimate_bytes(params), _physical_ram()
        if need > _RAM_SHARE * ram:
            raise ValueError(
                f"n_vectors: {params.n_vectors} x dim {params.dim} ({params.dtype}) needs about "
                f"{need / 1e9:.1f} GB, above {_RAM_SHARE:.0%} of this machine's "
                f"{ram / 1e9:.1f} GB of RAM; lower n_vectors (chunk bounds only the temporaries)"
            )

    def run(self, params: SpeedParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        arrays = ctx.arrays
        implementation = arrays.implementation(method)
        codecs = (implementation.key_codec(), implementation.value_codec())
        if None in codecs:
            raise ValueError(f"speed needs a codec method; {method.name!r} has no codec")
        n, dim = params.n_vectors, params.dim
        for codec in codecs:
            if params.chunk and params.chunk < n and params.chunk % codec.token_block:
                raise ValueError(f"chunk: {params.chunk} is not a multiple of the codec's token "
                                 f"block of {codec.token_block} (its groups span tokens)")
        x = make_vectors(params.data, n, dim, params.data_seed).reshape(1, 1, n, dim)
        x = arrays.from_torch(x.to(ctx.device, DTYPES[params.dtype]))
        # The first half goes through the key codec, the rest through the value codec: the same
        # work as one pass when they are one codec, and each counted when they differ (KIVI).
        halves = (x[..., : n // 2, :], x[..., n // 2 :, :])
        pairs = [(c, h) for c, h in zip(codecs, halves) if h.shape[-2]]  # n = 1: no key half

        def encode():
            return [encode_chunks(c, h, params.chunk) for c, h in pairs]

        def decode(packed):
            return [t for (c, _), parts in zip(pairs, packed) for t in decode_chunks(c, parts)]

        for _ in range(params.warmup):
            arrays.timed(lambda: decode(encode()))
            arrays.timed(partial(arrays.copy, x))

        seconds: dict[str, list[float]] = {"encode": [], "decode": [], "memcpy": []}
        for _ in range(ctx.repeats):
            packed, t = arrays.timed(encode)
            seconds["encode"].append(t)
            decoded, t = arrays.timed(partial(decode, packed))
            seconds["decode"].append(t)
            seconds["memcpy"].append(arrays.timed(partial(arrays.copy, x))[1])
        # A speed taken on the wrong output means nothing: decode must give back the input.
        if decoded_shape(decoded) != list(x.shape):
            raise RuntimeError(f"decode gave shape {decoded_shape(decoded)}, not {list(x.shape)}")

        in_bytes, out_bytes = arrays.nbytes(x), sum(arrays.nbytes(t) for t in decoded)
        nbytes = sum(c.nbytes(p) for (c, _), parts in zip(pairs, packed) for p in parts)
        encode_gb = [in_bytes / t / 1e9 for t in seconds["encode"]]
        decode_gb = [out_bytes / t / 1e9 for t in seconds["decode"]]
        memcpy_gb = [in_bytes / t / 1e9 for t in seconds["memcpy"]]
        samples = {
            "encode_vectors_s": [n / t for t in seconds["encode"]],
            "decode_vectors_s": [n / t for t in seconds["decode"]],
            "encode_gb_s": encode_gb,
            "decode_gb_s": decode_gb,
            "memcpy_gb_s": memcpy_gb,
            "encode_vs_memcpy": [e / c for e, c in zip(encode_gb, memcpy_gb, strict=True)],
            "decode_vs_memcpy": [d / c for d, c in zip(decode_gb, memcpy_gb, strict=True)],
        }
        m = self.metrics
        metrics = {name: m[name].of_samples(values) for name, values in samples.items()}
        metrics["nbytes"] = m["nbytes"].of(nbytes)
        metrics["compression_ratio"] = m["compression_ratio"].of(2 * n * dim / nbytes)
        return BenchmarkOutput(
            metrics=metrics,
            info={
                "layout": method.layout(), "n": n, "dim": dim, "dtype": params.dtype,
                "decoded_shape": decoded_shape(decoded), "backend": arrays.name,
                "torch_threads": torch.get_num_threads(),
            },
            comparable={"data": params.data, "shape": f"{n}x{dim}", "dtype": params.dtype,
                        "data_seed": str(params.data_seed)},
        )
