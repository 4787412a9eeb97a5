"""A kvbench quantizer from another package: keys and values at 4 bits per token, the first
`sinks` and the newest `window` tokens kept exact. Its settings, torch-free (a suite naming it
validates without torch); the torch implementation is in kvbench_sinkq.torch_codec."""
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import at_least, param
from kvbench.methods.settings import MethodSettings
from kvbench.methods.settings.codec_policy import CodecPolicy


@dataclass
class SinkQ(CodecPolicy, MethodSettings):
    """4-bit asymmetric quantization per token (fp16 scale and min per `group_size` channels)
    between exact attention sinks and an exact recent window."""

    # the settings kvbench.testing.check_method is run with by the plug-in's own test
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {}, {"sinks": 8, "window": 0, "group_size": 8})
    # imported when kvbench first builds it on torch
    implemented_in: ClassVar[dict[str, str]] = {"torch": "kvbench_sinkq.torch_codec"}

    # CodecMethod hands both to kvbench's CodecCache, which keeps those tokens unpacked
    sinks: int = param(4, range=at_least(0), meaning="first tokens kept exact")
    window: int = param(16, range=at_least(0), meaning="newest tokens kept exact")
    group_size: int = param(32, range=at_least(1), meaning="channels per fp16 scale and min")

    def token_block(self) -> int:
        return 1  # its codec packs token by token
