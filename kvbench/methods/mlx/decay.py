"""`decay` on MLX: temporal requantization and eviction by segment (kvbench.methods.decay).

The schedule is the torch config's (Decay.score, bits_for, widths, window, segment, evict_below)
and the cache logic is torch's DecayCache itself, run on mx.array: MLXDecayCache stores segments
with the base's MLX codecs at each width (on_mlx of the base built at that width) and uses the
MLX array operations, so both backends form, requantize and evict the same segments at the same
steps and count the same bytes.
"""
from __future__ import annotations

from kvbench.methods.base import Codec
from kvbench.methods.decay import Decay, DecayCache
from kvbench.methods.mlx.base import MLX_OPS, MLXMethod, mlx_implementation, on_mlx


class MLXDecayCache(DecayCache):
    """DecayCache on mx.array (kvbench.methods.mlx.base.MLXOps)."""

    ops = MLX_OPS


@mlx_implementation(Decay)
class MLXDecay(MLXMethod):
    """Decay on MLX; config: kvbench.methods.decay.Decay, every field honoured. The codecs at each
    width in config.widths() are the MLX key and value codecs of config.variant(bits)."""

    def __init__(self, config: Decay):
        super().__init__(config)
        self._codecs: dict[int, tuple[Codec, Codec]] = {}
        for bits in config.widths():
            port = on_mlx(config.variant(bits))
            self._codecs[bits] = (port.key_codec(), port.value_codec())

    def codecs(self, bits: int) -> tuple[Codec, Codec]:
        return self._codecs[bits]

    def key_codec(self) -> Codec:
        return self._codecs[self.config.base_bits][0]

    def value_codec(self) -> Codec:
        return self._codecs[self.config.base_bits][1]

    def new_layer_cache(self, layer_idx: int) -> MLXDecayCache:
        return MLXDecayCache(self.config, self.codecs)
