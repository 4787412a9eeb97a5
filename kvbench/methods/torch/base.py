"""What the torch codecs share: the choice between the torch reference and the kernels (impl),
and the log of which ran (handed over by Implementation.run_as)."""
from __future__ import annotations

from abc import abstractmethod

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.kernels import ImplLog, numba_installed, use_triton
from kvbench.kernels.formats import KernelFormat
from kvbench.methods.core.contracts import Codec, Packed


class TorchCodec(Codec):
    """A torch codec: its arrays are torch tensors. Its `impl` ("auto" | "torch" | "triton",
    kvbench.kernels) says who encodes and decodes; a method with kernels sets it from its
    settings and hands over its log of what ran (run_as)."""

    arrays = TORCH_ARRAYS
    impl: str = "torch"
    impl_log: ImplLog | None = None

    def kernel_format(self, dim: int) -> KernelFormat:
        """The layout of vectors of `dim` values, as kvbench.kernels.triton reads and writes it."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")

    def kernel_for(self, device: torch.device, dim: int) -> KernelFormat | None:
        """The kernel format to run for tensors on `device`, or None for the torch reference,
        as self.impl chooses (kvbench.kernels.use_triton)."""
        if self.impl == "torch":
            return None
        reason = self.kernel_unsupported()
        fmt = None
        if not reason:
            fmt = self.format_for(dim)
            reason = fmt.unsupported()
        return fmt if use_triton(self.impl, device, reason) else None

    def format_for(self, dim: int) -> KernelFormat:
        """kernel_format(dim), made once per dim: it keeps its tables on each device for every
        later call."""
        formats = self.__dict__.setdefault("_kernel_formats", {})
        return formats.get(dim) or formats.setdefault(dim, self.kernel_format(dim))

    def attention_kernel(self, device: torch.device, dim: int) -> tuple[str, KernelFormat] | None:
        """The fused decode attention that reads this codec's packed rows of `dim` values on
        `device`, with their format: "triton" where kernel_for picks the kernels, "cpu" for
        impl "auto" on CPU tensors where numba is installed; None: the reference (decode, then
        attention)."""
        fmt = self.kernel_for(device, dim)
        if fmt is not None:
            return None if fmt.attention_unsupported() else ("triton", fmt)
        if self.impl != "auto" or device.type != "cpu" or self.kernel_unsupported() \
                or not numba_installed():
            return None
        fmt = self.format_for(dim)
        return None if fmt.cpu_attention_unsupported(dim) else ("cpu", fmt)

    def kernel_encode(self, x: torch.Tensor) -> Packed | None:
        """x packed by the kernel, when kernel_for picks it; else None (the caller runs the
        reference). Notes which ran in impl_log."""
        fmt = self.kernel_for(x.device, x.shape[-1])
        self.note("encode", fmt)
        if fmt is None:
            return None
        from kvbench.kernels import triton as kernels

        return Packed(kernels.encode(x, fmt), tuple(x.shape), x.dtype)

    def kernel_decode(self, packed: Packed) -> torch.Tensor | None:
        """The decoded tensor by the kernel, when kernel_for picks it; else None."""
        device = next(iter(packed.tensors.values())).device
        fmt = self.kernel_for(device, packed.shape[-1])
        self.note("decode", fmt)
        if fmt is None:
            return None
        from kvbench.kernels import triton as kernels

        return kernels.decode(packed.tensors, fmt, packed.shape, packed.dtype)

    def note(self, operation: str, fmt: KernelFormat | None) -> None:
        if self.impl_log is not None:
            self.impl_log.note(operation, "torch" if fmt is None else "triton")


class KernelCodec(TorchCodec):
    """A codec that encodes and decodes with its kernel where kernel_for picks one, else with
    its torch reference (reference_encode, reference_decode)."""

    @abstractmethod
    def reference_encode(self, x: torch.Tensor) -> Packed: ...

    @abstractmethod
    def reference_decode(self, packed: Packed) -> torch.Tensor: ...

    def encode(self, x: torch.Tensor) -> Packed:
        packed = self.kernel_encode(x)
        return self.reference_encode(x) if packed is None else packed

    def decode(self, packed: Packed) -> torch.Tensor:
        decoded = self.kernel_decode(packed)
        return self.reference_decode(packed) if decoded is None else decoded
