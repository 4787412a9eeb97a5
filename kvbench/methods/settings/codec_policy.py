"""What a method stored by kvbench's codec cache (kvbench.methods.core.codec_cache.CodecCache)
keeps beside its codecs' packed tokens: the first `sinks` and the newest `window` tokens, in full
precision. A benchmark that measures the codecs alone (proofs) cannot see either."""
from __future__ import annotations

from typing import Any

from kvbench.config.fields import at_least, param

SINKS_MEANING = "first tokens (attention sinks) kept in full precision, never packed; unset: none"


def sinks_param(default: int | None = None) -> Any:
    """The `sinks` field of a codec cache method's settings. Built-in methods default to None
    (no sinks): a 0 would be a new value in every result's method_params, and the gate matches
    only an unset setting with its absence from an older baseline."""
    return param(default, range=at_least(0), meaning=SINKS_MEANING)


class CodecPolicy:
    """Mixin for the settings of a method stored in a CodecCache (its fields `sinks` and
    `window`): says what its caches keep beside the packed tokens."""

    sinks: int | None
    window: int

    def policy_beyond_codec(self) -> list[str]:
        """See kvbench.methods.settings.base.MethodSettings.policy_beyond_codec."""
        parts = []
        if self.sinks:
            parts.append(f"first {self.sinks} tokens full precision (sinks)")
        if self.window:
            parts.append(f"newest {self.window} tokens full precision (window)")
        return parts
