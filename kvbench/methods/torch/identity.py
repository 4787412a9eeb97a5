"""`identity` on torch: keeps every key and value (kvbench.methods.settings.identity)."""
from __future__ import annotations

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.backends.torch_backend import DTYPES
from kvbench.methods.core.identity import IdentityCodec, IdentityMethod
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.identity import Identity


class CastCodec(IdentityCodec):
    """IdentityCodec on torch tensors, each stored contiguous."""

    arrays, dtypes = TORCH_ARRAYS, DTYPES

    def kept(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.contiguous()


@implements(Identity)
class TorchIdentity(IdentityMethod):
    def codec(self) -> CastCodec:
        return CastCodec(self.settings.dtype)
