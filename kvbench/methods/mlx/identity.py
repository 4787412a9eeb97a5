"""`identity` on MLX: keeps every key and value (kvbench.methods.settings.identity)."""
from __future__ import annotations

import mlx.core as mx

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.methods.core.identity import IdentityCodec, IdentityMethod
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.identity import Identity


class MLXCastCodec(IdentityCodec):
    """IdentityCodec on mx.array."""

    arrays = MLX_ARRAYS
    dtypes = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


@implements(Identity, backend="mlx")
class MLXIdentity(IdentityMethod):
    def codec(self) -> MLXCastCodec:
        return MLXCastCodec(self.settings.dtype)
