"""`speed`: how fast a codec encodes and decodes, against a plain memory copy of the same bytes.

Vectors (1, 1, n, dim) in `dtype` are encoded, decoded and copied (on torch, copy_ into one
buffer kept across repeats: one read and one write of the input, the memcpy baseline; on MLX a new
array) in every repeat, so each repeat's ratio to memcpy compares runs made moments apart on the
same, possibly noisy, machine.
"""
from __future__ import annotations

from functools import partial

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.speed import Speed, SpeedParams
from kvbench.data.synthetic import make_vectors
from kvbench.methods.core.contracts import Codec, Implementation, Packed

def encode_chunks(codec: Codec, x: torch.Tensor, chunk: int) -> list[Packed]:
    """x (..., n, dim) encoded whole (chunk 0) or in calls of `chunk` tokens."""
    step = chunk or x.shape[-2]
    return [codec.encode(x[..., i : i + step, :]) for i in range(0, x.shape[-2], step)]


def decode_chunks(codec: Codec, parts: list[Packed]) -> list[torch.Tensor]:
    return [codec.decode(p) for p in parts]


def _views_of(outputs: list, inputs: list) -> bool:
    """Whether every output lies in an input's memory (a step that did no work); False where
    that cannot be told (MLX arrays)."""
    try:
        held = {t.untyped_storage().data_ptr() for t in inputs}
        return all(t.untyped_storage().data_ptr() in held for t in outputs)
    except AttributeError:
        return False


def decoded_shape(parts: list[torch.Tensor]) -> list[int]:
    """The shape the decoded chunks would have joined along tokens."""
    return [*parts[0].shape[:-2], sum(p.shape[-2] for p in parts), parts[0].shape[-1]]


@measures(Speed)
class SpeedRun(Speed):
    def run(self, params: SpeedParams, method: Implementation, ctx: RunContext) -> BenchmarkOutput:
        arrays = ctx.arrays
        codecs = (method.key_codec(), method.value_codec())
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
            arrays.timed(partial(arrays.reference_copy, x))

        seconds: dict[str, list[float]] = {"encode": [], "decode": [], "memcpy": []}
        for _ in range(ctx.repeats):
            packed, t = arrays.timed(encode)
            seconds["encode"].append(t)
            decoded, t = arrays.timed(partial(decode, packed))
            seconds["decode"].append(t)
            seconds["memcpy"].append(arrays.timed(partial(arrays.reference_copy, x))[1])
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
        # A step that hands back its input (identity stores what it is given) does no work:
        # its rate would time nothing, so it reads n/a (no metric) rather than a huge number.
        stored = [t for parts in packed for p in parts for t in p.tensors.values()]
        idle = {"encode": _views_of(stored, [x]), "decode": _views_of(decoded, stored)}
        samples = {name: values for name, values in samples.items()
                   if not idle.get(name.partition("_")[0])}
        m = self.metrics
        metrics = {name: m[name].of_samples(values) for name, values in samples.items()}
        metrics["nbytes"] = m["nbytes"].of(nbytes)
        metrics["compression_ratio"] = m["compression_ratio"].of(2 * n * dim / nbytes)
        return BenchmarkOutput(
            metrics=metrics,
            info={
                "layout": method.layout(), "n": n, "dim": dim, "dtype": params.dtype,
                "decoded_shape": decoded_shape(decoded), "backend": arrays.name,
                "not_timed": [step for step, none in idle.items() if none],
                "torch_threads": torch.get_num_threads(),
            },
            comparable={"data": params.data, "shape": f"{n}x{dim}", "dtype": params.dtype,
                        "data_seed": str(params.data_seed)},
        )
