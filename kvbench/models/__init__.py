"""Models: the bundled checkpoint, tiny test models, spec loading and the cache adapter."""
from kvbench.models.bundled import BUNDLED, prepare_bundled
from kvbench.models.home import kvbench_home
from kvbench.models.loading import LoadedModel, describe_model, load_model

__all__ = [
    "BUNDLED", "LoadedModel", "describe_model", "kvbench_home", "load_model", "prepare_bundled",
]
