"""`identity`: keeps every key and value; the reference every other method is measured against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import param
from kvbench.methods.settings.base import Capabilities, MethodSettings, register_method


@register_method("identity")
@dataclass
class Identity(MethodSettings):
    """Keeps everything.

    Must reproduce the unmodified model exactly with dtype "auto" (stores what the model gives).
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.identity",
        "mlx": "kvbench.methods.mlx.identity",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {}, {"dtype": "float16"}, {"storage": "concat"})

    dtype: Literal["auto", "float16", "bfloat16", "float32"] = param(
        "auto", meaning="storage dtype; auto keeps the model's own")
    # unset means buffer: the same results bit for bit as the joined cache of old, so records
    # from before the setting existed stay comparable
    storage: Literal["buffer", "concat"] | None = param(
        None, meaning="buffer (unset): tokens written in place into room kept for them (as a"
        " static cache or llama.cpp's); concat: every step joins the whole cache with its"
        " tokens, as transformers' DynamicCache does (the slower baseline, for ratios against"
        " it)")

    def supports(self) -> Capabilities:
        # stored as given, every token stays raw and can be taken back; a cast packs them
        return Capabilities(trim=self.dtype == "auto")

    def token_block(self) -> int:
        return 1
