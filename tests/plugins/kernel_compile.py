"""Compile every Triton kernel kvbench launches for a CUDA GPU, on a machine without one.

`python -m tests.plugins.kernel_compile [--every-tile] [ARCH ...]` (default 90: Hopper) runs the
kernels' host code on CPU tensors with each launch replaced by triton.compile for the target (PTX
and cubin by the ptxas that triton ships), and prints one line per compiled kernel: the GPU
compiler accepts what the interpreter ran. Must run without TRITON_INTERPRET (the kernels compile
only then). Attention compiles each layout in the first tile configuration and each
configuration in the last layout; --every-tile: each configuration in each layout; and the
last layout with softcap, sinks and a window, in each dtype; and the batched step's table path
(kvbench.kernels.triton.rows) over every layout, in the first configuration, in each dtype.
"""
from __future__ import annotations

import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, mangle_type

from kvbench.kernels import triton as kernels
from kvbench.kernels.formats import KVSegment
from kvbench.kernels.triton import attention, rows
from kvbench.kernels.triton.segments import decode_attention
from kvbench.methods import build_method, implementation

COMPILED: list[str] = []


def _compile_instead(arch: int):
    def run(self, *args, grid, warmup, **kwargs):
        bound = dict(zip(self.arg_names, args))
        options = {}
        for name, value in kwargs.items():
            (bound if name in self.arg_names else options)[name] = value
        signature = {p.name: "constexpr" if p.is_constexpr else mangle_type(bound[p.name])
                     for p in self.params}
        constexprs = {p.name: bound[p.name] for p in self.params if p.is_constexpr}
        compiled = triton.compile(ASTSource(fn=self, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", arch, 32), options=options)
        COMPILED.append(f"sm_{arch} {self.__name__} {len(compiled.asm['cubin'])} B cubin "
                        f"{compiled.metadata.shared} B shared")
    return run


def _launch_everything(every_tile: bool) -> None:
    """Each codec kernel in each layout and every attention layout, bf16 and fp32."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, 2, 40, 128, generator=generator).to(dtype)
        query = torch.randn(1, 8, 128, generator=generator).to(dtype)
        methods = [("intq", {}), ("intq", {"axis": "channel", "bits": 2}),
                   ("lloydmax", {}), ("turbo3", {})]
        segments = [KVSegment(x, x)]
        for name, params in methods:
            codec = implementation(build_method(name, {**params, "impl": "triton"})).codec()
            fmt = codec.kernel_format(128)
            packed = kernels.encode(x, fmt)
            kernels.decode(packed, fmt, tuple(x.shape), dtype)
            if fmt.attention_unsupported() is None:
                segments.append(KVSegment(packed, packed, fmt, fmt))
        # each tile configuration the GPU's autotuning tries (in bfloat16; float32: the first)
        attention._SPLIT = attention._split
        configs = attention._tuned().configs
        for config in configs if dtype == torch.bfloat16 else configs[:1]:
            attention._TILE = {**config.kwargs, "num_warps": config.num_warps,
                               "num_stages": config.num_stages}
            layouts = segments if every_tile or config is configs[0] else segments[-1:]
            decode_attention(query, layouts, splits=2, bias=torch.zeros(1, 2, 40 * len(layouts)))
        # the softcap's and the sinks' branches (and a window), in the last layout
        attention._TILE = {**configs[0].kwargs, "num_warps": configs[0].num_warps,
                           "num_stages": configs[0].num_stages}
        decode_attention(query, segments[-1:], splits=2, softcap=30.0, sinks=torch.zeros(8),
                         window=30)
        # the rows of a batched step (_split's table path): two rows, a slot per layout
        rows.decode_attention_rows(torch.cat([query, query]), [segments, segments], splits=2)


def main(arches: list[int], every_tile: bool = False) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run without TRITON_INTERPRET=1: the interpreter compiles nothing", file=sys.stderr)
        return 2
    for arch in arches:
        JITFunction.run = _compile_instead(arch)
        _launch_everything(every_tile)
    print("\n".join(COMPILED))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main([int(a) for a in args if a != "--every-tile"] or [90], "--every-tile" in args))
