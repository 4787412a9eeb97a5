"""MLX implementations of the methods (and the wrappers', which run on every backend): importing
this package registers them. The same Codec and LayerCachePolicy contracts
(kvbench.methods.core) on mx.array, registered against the settings with
implements(Settings, backend="mlx").

The torch implementation is the reference; tests/test_mlx_parity.py checks each MLX one against
it. Nothing here imports torch when imported: where the reference defines constants (Lloyd-Max
codebooks solved in float64, rotations and QJL matrices drawn from torch's seeded generators), an
MLX codec takes them from the reference codec when it is built, so both quantize against the
same numbers.
"""
from kvbench.methods.core import wrappers  # noqa: F401 - registers them
from kvbench.methods.mlx import identity, intq, kivi, lloydmax, token_policies, turbo  # noqa: F401
