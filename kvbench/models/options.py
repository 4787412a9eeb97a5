"""How a suite's model is loaded and prompted, beside its spec and dtype (torch-free: the suite
builds these, a case carries them to wherever it runs)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
AUTO = "auto"


@dataclass(frozen=True)
class LoadOptions:
    """What transformers is told when it loads the model, beyond the dtype."""

    trust_remote_code: bool = False  # run the checkpoint's own modelling code (auto_map)
    # accelerate's placement of a model larger than one device: "auto", "balanced",
    # "sequential", or {module: device}; None: the whole model on the case's device
    device_map: str | dict[str, Any] | None = None
    max_memory: dict[str, str] | None = None  # with device_map: {device: "70GiB", ...}
    max_context: int | None = None  # tokens the model is good for, in place of its config's
    checkpoint_dtype: str | None = None  # what its config.json says it stores: auto's on a GPU

    def key(self) -> str:
        """The same text for the same options: what a run's model cache is keyed by."""
        return json.dumps(asdict(self), sort_keys=True, default=str)


@dataclass(frozen=True)
class ChatOptions:
    """How a question is put to a chat model: its chat template's extra arguments (Qwen3's
    enable_thinking) and a system message."""

    system_prompt: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What a case's record keeps (empty when nothing is set: as records before these)."""
        return {key: value for key, value in (("system_prompt", self.system_prompt),
                                              ("chat_template_kwargs", self.template_kwargs))
                if value}

    def key(self) -> str:
        """The same text for the same options: a part of the memo key of anything they frame."""
        return json.dumps(self.record(), sort_keys=True, default=str)


def resolved_dtype(setting: str, device_type: str, checkpoint_dtype: str | None) -> str:
    """The dtype a torch model runs in: `setting`, where it names one; for auto, the
    checkpoint's own on a GPU (CUDA, MPS) and float32 on the CPU (the CPU's half precision is
    slow and not what a CPU user runs)."""
    if setting != AUTO:
        return setting
    if device_type in ("cuda", "mps") and checkpoint_dtype in DTYPES:
        return checkpoint_dtype
    return "float32"
