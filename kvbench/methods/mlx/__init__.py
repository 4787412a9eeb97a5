"""MLX implementations of the methods; importing this package registers them."""
from kvbench.methods.mlx import identity, intq, kivi, lloydmax, turbo  # noqa: F401
from kvbench.methods.mlx import adaptive, decay, sparse_v  # noqa: F401
from kvbench.methods.mlx import token_policies  # noqa: F401
from kvbench.methods.mlx.base import MLXCodec, MLXCodecCache, MLXMethod, has_mlx, on_mlx

__all__ = ["MLXCodec", "MLXCodecCache", "MLXMethod", "has_mlx", "on_mlx"]
