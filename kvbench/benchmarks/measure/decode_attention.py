"""`decode_attention`: one decode step's attention over a long cache, read packed by the fused
kernel (kvbench.kernels.triton.attention on CUDA, kvbench.kernels.cpu.attention on the CPU),
against torch SDPA over plain K/V of the same shape and against the reference path (decode the
packed K/V, then SDPA), timed in the same repeat.

The K/V are random, made on the device; `copies` independent sets are cycled through so that
successive calls read memory, not a cache that one set would fit in (as every layer of a real
model reads its own cache). On CUDA each sample replays a CUDA graph of the calls: the device's
time, without Python's launch overhead (which a model would also pay per layer, graphs aside).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from kvbench.backends.torch_backend import DTYPES, timed
from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.decode_attention import DecodeAttention, DecodeAttentionParams
from kvbench.kernels import INSTALL_HINT, interpreting
from kvbench.kernels.formats import KVSegment
from kvbench.methods.core.contracts import Implementation
from kvbench.models.attention import decode_attention_of

_SAMPLE_S = 0.02  # each timed sample runs calls for about this long (timed eagerly)
_MAX_CALLS = 200
_MAX_COPIES = 64


def _fused_read(method: Implementation, device: torch.device, dim: int):
    """(kernel, key format, value format): the fused attention that reads the method's packed
    layout here ("triton" or "cpu", kvbench.kernels), formats None for a method that stores
    plain K/V (identity); ValueError when its codecs have no fused path here."""
    keys, values = method.key_codec(), method.value_codec()
    if keys is None or values is None:
        raise ValueError(f"decode_attention needs a codec method; {method.name!r} has none")
    if method.name == "identity":
        return ("cpu" if device.type == "cpu" and not interpreting() else "triton"), None, None
    chosen = []
    for codec in (keys, values):
        reason = codec.kernel_unsupported()
        if reason:
            raise ValueError(f"method {method.name!r} has no fused attention: {reason}")
        read = codec.attention_kernel(device, dim)
        if read is None:
            raise ValueError(
                f"the fused attention runs on CUDA with triton ({INSTALL_HINT}) and impl auto or"
                f" triton, on the CPU with numba and impl auto, or under TRITON_INTERPRET=1 with"
                f" impl triton; here {method.name!r} runs impl {codec.impl!r} on {device.type}"
                f" (its layout: {codec.format_for(dim)})")
        chosen.append(read)
    (kernel, key_format), (value_kernel, value_format) = chosen
    if kernel != value_kernel:
        raise ValueError(f"method {method.name!r} reads keys by {kernel} and values by"
                         f" {value_kernel}: one kernel must read both")
    return kernel, key_format, value_format


def _copies(params: DecodeAttentionParams, device: torch.device) -> int:
    """K/V sets enough that their plain bytes are 4x the last-level cache (the GPU's L2, the
    CPU's L3 where the system says it), at most _MAX_COPIES."""
    if params.copies:
        return params.copies
    if device.type == "cuda":
        cache = torch.cuda.get_device_properties(device).L2_cache_size
    else:
        cache = _cpu_l3_bytes()
    plain = 2 * params.batch * params.kv_heads * params.context * params.head_dim * \
        DTYPES[params.dtype].itemsize
    return max(1, min(_MAX_COPIES, math.ceil(4 * cache / plain)))


def _cpu_l3_bytes() -> int:
    """The L3 cache's size as Linux reports it (sysfs, e.g. "32768K"); 0 where it does not."""
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return 0
    scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
    return int(size.rstrip("KM")) * scale


def _sample(fn, calls: int, device: torch.device) -> float:
    """Seconds per call of fn(i) over calls i = 0 .. calls - 1, the device drained around."""
    return timed(lambda: [fn(i) for i in range(calls)], device)[1] / calls


def _replayable(fn, calls: int, device: torch.device):
    """A function of i that runs fn(0) .. fn(calls - 1) whatever i: on CUDA one replay of a
    graph captured from those calls, so a sample times the device's work and not Python's
    launches (which take longer than a short kernel runs); elsewhere the calls themselves."""
    if device.type != "cuda":
        return lambda i: [fn(j) for j in range(calls)]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(0)  # what the capture allocates comes from its own pool, warmed here
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fn(j)
    return lambda i: graph.replay()


@measures(DecodeAttention)
class DecodeAttentionRun(DecodeAttention):
    def run(self, params: DecodeAttentionParams, method: Implementation, ctx: RunContext
            ) -> BenchmarkOutput:
        device, dtype = ctx.device, DTYPES[params.dtype]
        dim = params.head_dim
        kernel, key_format, value_format = _fused_read(method, device, dim)
        decode_attention = decode_attention_of(kernel)
        key_codec, value_codec = method.key_codec(), method.value_codec()
        copies = _copies(params, device)
        generator = torch.Generator(device).manual_seed(params.data_seed)

        def random(*shape):
            return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32
                               ).to(dtype)

        shape = (params.batch, params.kv_heads, params.context, dim)
        query = random(params.batch, params.q_heads, 1, dim)
        plain = [(random(*shape), random(*shape)) for _ in range(copies)]
        ctx.status(f"packing {copies} K/V copies of {params.context} tokens")
        packed = [(key_codec.encode(k), value_codec.encode(v)) for k, v in plain]
        if key_format is None:
            segments = [[KVSegment(k, v)] for k, v in plain]
        else:
            segments = [[KVSegment(pk.tensors, pv.tensors, key_format, value_format)]
                        for pk, pv in packed]
            method.impl_log.note("decode attention", kernel)
        scaling = dim ** -0.5

        def fused(i):
            return decode_attention(query, segments[i % copies], scaling=scaling)

        def sdpa(i):
            k, v = plain[i % copies]
            return F.scaled_dot_product_attention(query, k, v, scale=scaling, enable_gqa=True)

        def decode_sdpa(i):
            pk, pv = packed[i % copies]
            k, v = key_codec.decode(pk), value_codec.decode(pv)
            return F.scaled_dot_product_attention(query, k, v, scale=scaling, enable_gqa=True)

        pk, pv = packed[0]
        exact = _exact_attention(query, key_codec.decode(pk), value_codec.decode(pv), scaling)
        rel_error = float((fused(0).double() - exact).norm() / exact.norm())

        all_plain = torch.cat([k.reshape(-1) for k, _ in plain])
        copy_to = torch.empty_like(all_plain)
        paths = {"fused": fused, "sdpa": sdpa, "decode_sdpa": decode_sdpa,
                 "memcpy": lambda i: copy_to.copy_(all_plain)}
        calls, runs = {}, {}
        for name, fn in paths.items():
            for i in range(params.warmup):
                fn(i)  # the first call of a kernel compiles (and tunes) it
            once = _sample(fn, 1, device)
            calls[name] = max(1, min(_MAX_CALLS, math.ceil(_SAMPLE_S / max(once, 1e-7))))
            runs[name] = _replayable(fn, calls[name], device)
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        for repeat in range(ctx.repeats):
            ctx.status(f"repeat {repeat + 1}/{ctx.repeats}")
            for name, run in runs.items():
                seconds[name].append(_sample(run, 1, device) / calls[name])

        plain_bytes = 2 * plain[0][0].numel() * plain[0][0].element_size()
        kv_bytes = (plain_bytes if key_format is None
                    else key_codec.nbytes(pk) + value_codec.nbytes(pv))
        copied = all_plain.numel() * all_plain.element_size()
        fused_gb = [kv_bytes / t / 1e9 for t in seconds["fused"]]
        memcpy_gb = [copied / t / 1e9 for t in seconds["memcpy"]]
        samples = {
            "fused_us": [t * 1e6 for t in seconds["fused"]],
            "sdpa_us": [t * 1e6 for t in seconds["sdpa"]],
            "decode_sdpa_us": [t * 1e6 for t in seconds["decode_sdpa"]],
            "sdpa_vs_fused": [s / f for s, f in zip(seconds["sdpa"], seconds["fused"])],
            "decode_sdpa_vs_fused": [s / f for s, f in zip(seconds["decode_sdpa"],
                                                           seconds["fused"])],
            "fused_gb_s": fused_gb,
            "memcpy_gb_s": memcpy_gb,
            "fused_read_vs_memcpy": [f / m for f, m in zip(fused_gb, memcpy_gb)],
        }
        tile = None
        if kernel == "triton":  # the GPU's autotuned choice (None in the interpreter)
            from kvbench.kernels.triton.attention import chosen_tile
            tile = chosen_tile()
        m = self.metrics
        metrics = {name: m[name].of_samples(values) for name, values in samples.items()}
        metrics["rel_error"] = m["rel_error"].of(rel_error)
        metrics["kv_bytes"] = m["kv_bytes"].of(kv_bytes)
        metrics["compression_ratio"] = m["compression_ratio"].of(
            2 * plain[0][0].numel() * 2 / kv_bytes)
        return BenchmarkOutput(
            metrics=metrics,
            info={"layout": method.layout(), "copies": copies, "calls_per_sample": calls,
                  "timing": "CUDA graph replays" if device.type == "cuda" else "eager calls",
                  "device_name": _device_name(device), "shape": list(shape),
                  "q_heads": params.q_heads, **({"tile": tile} if tile else {})},
            comparable={"shape": "x".join(map(str, shape)), "q_heads": str(params.q_heads),
                        "dtype": params.dtype, "data_seed": str(params.data_seed)},
        )


def _exact_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     scaling: float) -> torch.Tensor:
    """float64 softmax(q K^T * scaling) V, GQA by head groups."""
    groups = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(groups, dim=1)
    v = values.double().repeat_interleave(groups, dim=1)
    weights = torch.softmax(query.double() @ k.transpose(-1, -2) * scaling, dim=-1)
    return weights @ v


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
