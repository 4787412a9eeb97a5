"""Built-in methods register themselves on import."""
from kvbench.methods import adaptive, am, butterfly, decay, eviction  # noqa: F401
from kvbench.methods import identity, intq  # noqa: F401
from kvbench.methods import kivi  # noqa: F401
from kvbench.methods import lloydmax  # noqa: F401
from kvbench.methods import sparse_v  # noqa: F401
from kvbench.methods import turbo  # noqa: F401
from kvbench.methods.base import METHODS, Codec, LayerCachePolicy, Method, Packed

__all__ = ["METHODS", "Codec", "LayerCachePolicy", "Method", "Packed"]
