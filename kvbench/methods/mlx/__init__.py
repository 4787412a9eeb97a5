"""MLX implementations of the methods: the same Codec and LayerCachePolicy contracts
(kvbench.methods.core) on mx.array, registered against the settings with
implements(Settings, backend="mlx"), each module imported when its method is first built on MLX
(the settings name it: `implemented_in`; the wrappers' live in kvbench.methods.core).

The torch implementation is the reference; tests/test_mlx_parity.py checks each MLX one against
it. Nothing here imports torch when imported: where the reference defines constants (Lloyd-Max
codebooks solved in float64, rotations and QJL matrices drawn from torch's seeded generators), an
MLX codec takes them from the reference codec when it is built, so both quantize against the
same numbers.
"""
