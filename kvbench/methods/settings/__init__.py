"""Every method's settings, torch-free: importing this package registers the built-in ones."""
from kvbench.methods.settings import (  # noqa: F401 - registers them
    adaptive, am, butterfly, decay, eviction, hf_quantized, identity, intq, kivi, kvpress,
    lloydmax, mlx_lm_cache, sparse_v, turbo,
)
from kvbench.methods.settings.base import (
    METHODS, Capabilities, MethodSettings, build_method, implements, register_method,
)

__all__ = ["METHODS", "Capabilities", "MethodSettings", "build_method", "implements",
           "register_method"]
