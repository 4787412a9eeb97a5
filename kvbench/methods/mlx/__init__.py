"""MLX implementations of the methods (and the wrappers', which run on every backend);
importing this package registers them."""
from kvbench.methods.core import wrappers  # noqa: F401 - registers them
from kvbench.methods.mlx import identity, intq, kivi, lloydmax, token_policies, turbo  # noqa: F401
