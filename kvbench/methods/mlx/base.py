"""Methods on MLX: the same Codec and LayerCachePolicy contracts (kvbench.methods.core) on
mx.array, registered against the settings with implements(Settings, backend="mlx").

The torch implementation is the reference; tests/test_mlx_parity.py checks each MLX one against
it. Nothing here imports torch when imported: where the reference defines constants (Lloyd-Max
codebooks solved in float64, rotations and QJL matrices drawn from torch's seeded generators), an
MLX codec takes them from the reference codec when it is built, so both quantize against the
same numbers.
"""
from __future__ import annotations

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.core.contracts import Codec, Implementation


class MLXMethod(Implementation):
    """Base of MLX implementations (settings: the method's settings dataclass)."""

    def codec_cache(self, key_codec: Codec, value_codec: Codec, window: int) -> CodecCache:
        return CodecCache(key_codec, value_codec, window, MLX_ARRAYS)
