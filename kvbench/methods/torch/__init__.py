"""The torch reference implementations, each registered against its settings class: importing
this package registers them (and the wrappers', which run on every backend)."""
from kvbench.methods.core import wrappers  # noqa: F401 - registers them
from kvbench.methods.torch import (  # noqa: F401 - registers them
    am, butterfly, eviction, identity, intq, kivi, lloydmax, turbo,
)
