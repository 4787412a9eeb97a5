"""Turbo's encode and decode (kvbench.methods.settings.turbo.Turbo for the scheme), written once:
the torch TurboCodec and its MLX twin supply the array primitives and the parts (channels,
rotation, codebooks), so both run the same steps in the same order."""
from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Callable

from kvbench.backends.arrays import Arrays
from kvbench.methods.core.contracts import Packed


class TurboSteps:
    """encode_block and decode_block over the codec's `parts` (each with take, rotation.forward
    and .inverse, high and low codebooks, centroids, n_high, dim, norm_name), its block,
    mse_bits, norm_correction, qjl and norm_dtype, and what the backend supplies below."""

    parts: list[Any]
    block: int
    mse_bits: int
    norm_correction: bool
    qjl: bool
    norm_dtype: Any

    # ---- what each backend supplies
    arrays: Arrays
    norm: Callable[[Any], Any]  # the Euclidean norm over the last axis
    pack: Callable[[Any, int], Any]  # (codes, bits) -> bytes
    unpack: Callable[[Any, int, int], Any]  # (bytes, bits, codes) -> codes

    @abstractmethod
    def assemble(self, parts: list[Any]) -> Any:
        """Blocks (..., G, block) from each part's decoded channels."""

    @abstractmethod
    def sketch(self, residual: Any) -> Any:
        """residual @ the QJL matrix, transposed."""

    @abstractmethod
    def unsketch(self, signs: Any) -> Any:
        """signs @ the QJL matrix."""

    def float32(self, x: Any) -> Any:
        return self.arrays.cast(x, self.arrays.float32)

    def nonzero(self, x: Any) -> Any:
        """x with its zeros replaced by ones (a divisor)."""
        return self.arrays.where(x == 0, 1.0, x)

    # ---- the steps

    def encode_block(self, x: Any) -> Packed:
        dim = x.shape[-1]
        if dim % self.block:
            raise ValueError(f"head_dim {dim} is not a multiple of block {self.block}")
        blocks = self.float32(x).reshape(*x.shape[:-1], dim // self.block, self.block)
        tensors, decoded = {}, []
        for part in self.parts:
            v = part.take(blocks)
            gamma = self.norm(v)
            y = part.rotation.forward(v / self.nonzero(gamma)[..., None])
            n = part.n_high
            idx_high = part.high.quantize(y[..., :n]) if n else None
            idx_low = part.low.quantize(y[..., n:]) if n < part.dim else None
            c = part.centroids(idx_high, idx_low)
            if self.norm_correction:
                norm = self.arrays.cast(gamma / self.nonzero(self.norm(c)), self.norm_dtype)
            else:
                norm = self.arrays.cast(gamma, self.norm_dtype)
            tensors[part.norm_name] = norm
            if idx_low is not None:
                tensors["codes"] = self.pack(idx_low, self.mse_bits)
            if idx_high is not None:
                tensors["codes_high"] = self.pack(idx_high, self.mse_bits + 1)
            if self.qjl:
                decoded.append(part.rotation.inverse(c) * self.float32(norm)[..., None])
        if self.qjl:
            # The residual of what decode will rebuild from the stored norms, in x's scale.
            residual = blocks - self.assemble(decoded)
            signs = self.arrays.cast(self.sketch(residual) >= 0, self.arrays.uint8)
            tensors["signs"] = self.pack(signs, 1)
            tensors["rnorm"] = self.arrays.cast(self.norm(residual), self.norm_dtype)
        return Packed(tensors, tuple(x.shape), x.dtype)

    def decode_block(self, packed: Packed) -> Any:
        t = packed.tensors
        decoded = []
        for part in self.parts:
            n, n_low = part.n_high, part.dim - part.n_high
            idx_high = self.unpack(t["codes_high"], self.mse_bits + 1, n) if n else None
            idx_low = self.unpack(t["codes"], self.mse_bits, n_low) if n_low else None
            c = part.centroids(idx_high, idx_low)
            decoded.append(part.rotation.inverse(c) * self.float32(t[part.norm_name])[..., None])
        blocks = self.assemble(decoded)
        if self.qjl:
            signs = self.float32(self.unpack(t["signs"], 1, self.block)) * 2 - 1
            scale = math.sqrt(math.pi / 2) / self.block * self.float32(t["rnorm"])[..., None]
            blocks = blocks + scale * self.unsketch(signs)
        return self.arrays.cast(blocks.reshape(*blocks.shape[:-2], -1), packed.dtype)
