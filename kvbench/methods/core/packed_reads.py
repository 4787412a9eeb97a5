"""Reads of packed K/V without a decode at each step: chunks decoded once, or a fused kernel."""
from __future__ import annotations

from kvbench.kernels.formats import KernelFormat
from kvbench.methods.core.contracts import Codec, LayerCachePolicy

# Decoded chunks held apart before they are joined into one: a read joins at most this many
# arrays, and joining them costs a copy of the decoded cache only once every so many packs.
MAX_DECODED_CHUNKS = 32


class DecodedChunks:
    """Decoded arrays of the packed tokens, in token order, at the raw dtype (the decoded-once
    path): attention reads them joined with the raw tail."""

    def __init__(self, ops):
        self.ops = ops
        self.chunks: list = []

    def add(self, x) -> None:
        self.chunks.append(x)
        if len(self.chunks) > MAX_DECODED_CHUNKS:
            self.chunks = [self.ops.concat(self.chunks)]

    def read(self, raw):
        """The decoded tokens, then `raw`, as one array."""
        return self.ops.joined([*self.chunks, raw])


def check_fresh(policy: LayerCachePolicy, fresh: bool) -> None:
    if not fresh:
        raise RuntimeError(f"{type(policy).__name__}.keep_decoded() must be called before the"
                           " first append")


class FusedReads:
    """The fused decode attention that reads what a key and a value codec pack: both codecs'
    attention_kernel (kvbench.methods.torch.base.TorchCodec), asked once (the codecs, device and
    head size of a layer's cache stay), and noted as the "decode attention" at every read."""

    def __init__(self, key_codec: Codec, value_codec: Codec):
        self.codecs = (key_codec, value_codec)
        self._kernels: tuple | None = None

    def find(self, device, dim: int) -> tuple[str, KernelFormat, KernelFormat] | None:
        """(kernel, key format, value format) when one kernel reads both codecs' layouts of
        `dim` values on `device`; None: decode, then attention."""
        if not all(hasattr(codec, "attention_kernel") for codec in self.codecs):
            return None
        if self._kernels is None:
            self._kernels = tuple(codec.attention_kernel(device, dim) or (None, None)
                                  for codec in self.codecs)
        (key_kernel, key_fmt), (value_kernel, value_fmt) = self._kernels
        kernel = key_kernel if key_kernel == value_kernel else None
        for codec in self.codecs:
            if codec.impl_log is not None:
                codec.impl_log.note("decode attention", kernel or "torch")
        return None if kernel is None else (kernel, key_fmt, value_fmt)
