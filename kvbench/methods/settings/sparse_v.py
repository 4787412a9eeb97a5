"""`sparse_v`: any method's cache, with value rows of negligible softmax weight skipped at
decode."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, above, param
from kvbench.methods.settings.base import Capabilities, MethodSettings, register_method
from kvbench.methods.settings.wrapped import build_base


@register_method("sparse_v")
@dataclass
class SparseV(MethodSettings):
    """Sparse V: at each one-token decode step, skip the value rows whose softmax weight is below
    `tau` (TurboQuant+'s sparse-V: their dequantisation and their share of the weighted sum).

    Wraps any method: the cache stores what the base method stores (same bytes); attention runs in
    float32 with the skipped rows left out of the sum, not renormalised, as the kernel does. The
    cache counts rows skipped and the relative squared error of each step's attention output
    against the dense sum over the same cached values (its effect on output). Prefill is dense.
    In a suite: `{name: sparse_v, params: {base: turbo3, tau: 1.0e-4}}`.
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.core.wrappers",
        "mlx": "kvbench.methods.core.wrappers",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {}, {"base": "turbo3", "base_params": {"block": 16}, "tau": 1e-3},
        {"base": "am", "base_params": {"ratio": 0.5, "queries": "repeat"}})

    base: str = param("identity", meaning="the method whose cache is read sparsely")
    base_params: dict[str, Any] = param(factory=dict, meaning="its parameters")
    tau: float = param(1e-6, range=above(0),
                       meaning="softmax weight below which a value row is skipped")

    def check(self) -> None:
        if self.base == "sparse_v":
            raise SettingError("base", "base must be another method, not sparse_v")
        self.base_settings = build_base(self.base, self.base_params)

    def supports(self) -> Capabilities:
        return self.base_settings.supports()

    def reference_probe(self, prompt: list[int]) -> list[int]:
        return self.base_settings.reference_probe(prompt)

    def check_head_dim(self, head_dim: int) -> None:
        try:
            self.base_settings.check_head_dim(head_dim)
        except SettingError as exc:
            raise SettingError("base_params", f"base {self.base!r}: {exc}") from None

    def token_block(self) -> int | None:
        return self.base_settings.token_block()

    def holds_windows(self) -> bool:
        return self.base_settings.holds_windows()

    def asks_every_layer(self) -> bool:
        return self.base_settings.asks_every_layer()

    def policy_beyond_codec(self) -> list[str]:
        return [*self.base_settings.policy_beyond_codec(),
                f"value rows under softmax weight {self.tau:g} skipped at decode (sparse V)"]
