"""Every method's settings, torch-free. The built-in ones are named in METHODS's table
(kvbench.methods.settings.base) and imported when first looked up."""
from kvbench.methods.settings.base import (
    METHODS, Capabilities, MethodSettings, build_method, implements, register_method,
)

__all__ = ["METHODS", "Capabilities", "MethodSettings", "build_method", "implements",
           "register_method"]
