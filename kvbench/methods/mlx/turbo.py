"""`turbo` and its presets on MLX: TurboQuant / PolarQuant (kvbench.methods.settings.turbo).

The MLX codec is built around the torch TurboCodec of the same config and takes every constant
from it (rotation matrices, codebooks, outlier channels, QJL matrix), rounded to float32 as the
torch codec rounds them, so both backends quantize against the same numbers.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.turbo_steps import TurboSteps
from kvbench.methods.mlx.codebooks import MLXCodebook
from kvbench.methods.mlx.packing import pack_bits, unpack_bits
from kvbench.methods.mlx.rotation import MLXRotation
from kvbench.methods.mlx.tokenwise import MLXTokenwiseCodec
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.turbo import Turbo, Turbo2, Turbo2_5, Turbo3, Turbo3_5, Turbo4

_NORM_DTYPES = {"torch.float16": mx.float16, "torch.float32": mx.float32}


class MLXPart:
    """One reference Part on MLX: its channels (or None), rotation, codebooks and norm name."""

    def __init__(self, part):
        self.channels = None if part.channels is None else mx.array(part.channels.numpy())
        self.rotation = MLXRotation(part.rotation)
        self.n_high, self.dim, self.norm_name = part.n_high, part.dim, part.norm_name
        self.low = None if part.low is None else MLXCodebook(part.low)
        self.high = None if part.high is None else MLXCodebook(part.high)

    def take(self, blocks: mx.array) -> mx.array:
        return blocks if self.channels is None else mx.take(blocks, self.channels, axis=-1)

    def centroids(self, idx_high: mx.array | None, idx_low: mx.array | None) -> mx.array:
        found = [book.dequantize(idx) for book, idx in ((self.high, idx_high), (self.low, idx_low))
                 if idx is not None]
        return found[0] if len(found) == 1 else mx.concatenate(found, axis=-1)


class MLXTurboCodec(TurboSteps, MLXTokenwiseCodec):
    """TurboCodec on mx.array (see kvbench.methods.settings.turbo.Turbo for the scheme).

    reference: the torch TurboCodec whose constants this codec uses. Stored tensors have the
    names, shapes and dtypes of the reference's (codes, codes_high, norm, norm_high, signs,
    rnorm, as its configuration asks), so the byte counts are the same.
    """

    # Decode applies the rotation (and QJL) as matrix products, whose rounding can change with
    # the rows decoded at once: not chunk separable (kvbench.methods.core.contracts.Codec
    # .chunk_separable), unlike the torch codec's butterflies; the packed path stays.
    chunk_separable = False

    def __init__(self, reference):
        self.reference = reference
        self.bits, self.block, self.mse_bits = reference.bits, reference.block, reference.mse_bits
        self.norm_correction, self.qjl = reference.norm_correction, reference.qjl
        self.norm_dtype = _NORM_DTYPES[str(reference.norm_dtype)]
        self.parts = [MLXPart(p) for p in reference.parts]
        # Blocks are rebuilt from the parts' channels: concatenated in part order, then taken
        # back with the inverse permutation (torch: index_copy_ of each part into its channels).
        self._inverse = None
        if self.parts[0].channels is not None:
            order = np.concatenate([p.channels.numpy() for p in reference.parts])
            self._inverse = mx.array(np.argsort(order, kind="stable"))
        if self.qjl:
            self.qjl_matrix = mx.array(reference.qjl_matrix.float().numpy())
            self.qjl_matrix_t = mx.array(reference.qjl_matrix.float().T.contiguous().numpy())

    # ---- what TurboSteps takes from the backend
    arrays = MLX_ARRAYS
    pack, unpack = staticmethod(pack_bits), staticmethod(unpack_bits)
    encode, decode = TurboSteps.encode_block, TurboSteps.decode_block

    @staticmethod
    def norm(x: mx.array) -> mx.array:
        return mx.linalg.norm(x, axis=-1)

    def assemble(self, parts: list[mx.array]) -> mx.array:
        if self._inverse is None:
            return parts[0]
        return mx.take(mx.concatenate(parts, axis=-1), self._inverse, axis=-1)

    def sketch(self, residual: mx.array) -> mx.array:
        return residual @ self.qjl_matrix_t

    def unsketch(self, signs: mx.array) -> mx.array:
        return signs @ self.qjl_matrix

    def layout(self) -> str:
        return self.reference.layout()


@implements(Turbo, Turbo2, Turbo2_5, Turbo3, Turbo3_5, Turbo4, backend="mlx")
class MLXTurbo(CodecMethod):
    """Turbo and its presets (turbo2, turbo2.5, turbo3, turbo3.5, turbo4) on MLX, every setting
    honoured."""

    settings: Turbo

    def codec(self) -> MLXTurboCodec:
        from kvbench.methods.torch.turbo import TorchTurbo  # the reference's constants

        return MLXTurboCodec(TorchTurbo(self.settings, None).codec())
