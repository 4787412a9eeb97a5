"""How the fused decode attention's speed moves with its split count and tile sizes, on a GPU.

python ci/attention_sweep.py [PROGRAMS_PER_SM ...]: for each count of split programs per
multiprocessor, the kernel autotuned afresh over TILE_CONFIGS plus larger tiles, then per layout
and context: microseconds of one call (CUDA graph replays, K/V copies past the L2) and torch
SDPA over bf16 K/V timed beside it. One query token, 32 query heads on 8 KV heads of 128.
"""
import sys

import torch
import torch.nn.functional as F
import triton

from kvbench.kernels.formats import KVSegment
from kvbench.kernels.triton import attention, segments
from kvbench.methods import build_method, implementation

LAYOUTS = [("identity", None, {}), ("intq4", "intq", {"bits": 4}), ("turbo3", "turbo3", {})]
CONTEXTS = (16384, 32768, 131072)
EXTRA_TILES = ((128, 4, 2), (128, 8, 2), (64, 8, 4))


def graph_us(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return triton.testing.do_bench(graph.replay, warmup=5, rep=60) * 1e3 / calls


def main(per_sm):
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    attention.TILE_CONFIGS = attention.TILE_CONFIGS + EXTRA_TILES
    q = torch.randn(1, 32, 128, device=dev, generator=g).to(torch.bfloat16)
    data = {}
    for ctx in CONTEXTS:
        copies = max(1, (4 * 60 * 2**20) // (2 * 8 * ctx * 128 * 2) + 1)
        data[ctx] = [(torch.randn(1, 8, ctx, 128, device=dev, generator=g).to(torch.bfloat16),
                      torch.randn(1, 8, ctx, 128, device=dev, generator=g).to(torch.bfloat16))
                     for _ in range(copies)]
    print("programs/SM layout context fused_us sdpa_us sdpa/fused config", flush=True)
    for pps in per_sm:
        segments.PROGRAMS_PER_SM = pps
        attention._SPLIT = attention._tuned()
        for label, name, params in LAYOUTS:
            codec = None if name is None else implementation(
                build_method(name, {**params, "impl": "triton"})).codec()
            fmt = None if codec is None else codec.kernel_for(dev, 128)
            for ctx in CONTEXTS:
                sets = data[ctx]
                if codec is None:
                    segs = [[KVSegment(k, v)] for k, v in sets]
                else:
                    segs = []
                    for k, v in sets:
                        pk, pv = codec.encode(k), codec.encode(v)
                        segs.append([KVSegment(pk.tensors, pv.tensors, fmt, fmt)])
                state = {"i": 0}

                def fused():
                    state["i"] += 1
                    return segments.decode_attention(q, segs[state["i"] % len(segs)])

                def sdpa():
                    state["i"] += 1
                    k, v = sets[state["i"] % len(sets)]
                    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
                fused()
                f, s = graph_us(fused), graph_us(sdpa)
                best = getattr(attention._SPLIT, "best_config", None)
                print(f"{pps} {label} {ctx} {f:.1f} {s:.1f} {s / f:.3f} {best}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4, 8, 16])
