"""A method's settings, torch-free: the dataclass a suite's `methods:` entry builds, whose fields
declare type, default, range and meaning (kvbench.config.fields.param), what its caches support,
and the registry of methods by name.

Implementations (the torch reference, MLX, fused kernels) register against a settings class with
@implements(SettingsClass, backend) and are looked up by kvbench.methods.implementation.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

from kvbench.config.fields import Settings, SettingError, param
from kvbench.config.registry import Registry, UnknownName
from kvbench.config.strict import build_strict
from kvbench.kernels import check_impl

DEVICE_TYPES = ("cpu", "cuda", "mps")
BACKENDS = ("torch", "mlx")
Impl = Literal["auto", "torch", "triton"]
PrefillReads = Literal["exact", "stored"]
PREFILL_READS_MEANING = (
    "what a forward's tokens read of themselves: exact, the keys and values as the model made"
    " them (the earlier tokens as stored); stored, as the cache stores them (a prompt attends"
    " over its own quantized copy)")
IMPL_MEANING = ("who encodes and decodes: the torch reference, or the Triton kernels (the same"
                " bytes; kvbench.kernels); auto: the kernels on CUDA where triton is installed")


@dataclass(frozen=True)
class Capabilities:
    """What a method's caches support. A suite that asks for anything else is refused when it
    is validated; kvbench.testing.check_method checks each declared one for real. MLX support is
    an implementation registered for the exact settings class, not declared here."""

    decode_chunk: bool = True  # decode steps of several tokens (perplexity's decode_chunk > 1)
    trim: bool = False  # takes back any of its newest tokens before end_prefill (parity's trim,
    # a probe fed and taken back)
    probes: bool = False  # reads the queries of a probe fed and taken back before end_prefill
    chunked_prefill: bool = True  # a prompt fed in several forwards (the ladder's prefill_chunk)
    devices: tuple[str, ...] = DEVICE_TYPES  # torch device types its tensors may live on

    def lacks(self, wanted: str) -> bool:
        if wanted in DEVICE_TYPES:
            return wanted not in self.devices
        return not getattr(self, wanted)


@dataclass
class MethodSettings(Settings):
    """Base of every method's settings (a dataclass): the fields are the configuration.

    `capabilities` says what its caches support; `conformance_params` are the settings
    kvbench.testing.check_method runs it with (by default once, with its defaults)."""

    name: ClassVar[str] = ""
    extra: ClassVar[str | None] = None  # the kvbench extra its implementation needs (kvpress)
    capabilities: ClassVar[Capabilities] = Capabilities()
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    # A plug-in's modules that register its implementations, by backend, imported when one is
    # first asked for: the settings' own module then needs no torch (a suite naming the method
    # validates without it), e.g. {"torch": "my_package.torch_impl"}.
    implemented_in: ClassVar[dict[str, str]] = {}
    # A library's own cache or press (kvbench.methods.external), which kvbench hosts on plain
    # full-attention models only (kvbench.models.layer_kinds.refusal).
    library_cache: ClassVar[bool] = False
    # Scores tokens from the cached keys (the queries against them, or their norms): meaningless
    # where a layer caches something else in their place (an MLA latent), so refused there.
    scores_by_keys: ClassVar[bool] = False
    # Hands attention keys the tokens do not have (block summaries) with a per-query bias: not
    # where the model applies its own mask to part of the scores first (mlx-lm's absorbed MLA).
    adds_keys: ClassVar[bool] = False
    # A case's expected time against the plain cache's on the same work, where measured:
    # kvbench.run.cost orders the queue and balances shards by it (1: not known to differ).
    relative_cost: ClassVar[float] = 1.0

    # transformers' QuantizedCache returns the step's own key and value states to attention and
    # stores them quantized; KIVI's reference attends the prompt in full precision and packs it
    # after: "exact" is the field's semantics, "stored" what kvbench did before.
    prefill_reads: PrefillReads = param("exact", kw_only=True, meaning=PREFILL_READS_MEANING)

    def supports(self) -> Capabilities:
        """This configuration's capabilities (a wrapper's are its base's)."""
        return self.capabilities

    def check_head_dim(self, head_dim: int) -> None:
        """Refuse (SettingError) a configuration that cannot hold vectors of head_dim values:
        checked when a suite is validated, against its model or synthetic data."""

    def reference_probe(self, prompt: list[int]) -> list[int]:
        """Tokens a benchmark feeds after the prompt and takes back before end_prefill, so the
        policies can read their queries (e.g. the prompt again: repeat-prefill queries). None by
        default."""
        return []

    def token_block(self) -> int | None:
        """Tokens its codecs must pack at once (per-channel groups over tokens); None for a
        method without codecs."""
        return None

    def policy_beyond_codec(self) -> list[str]:
        """What its caches do that its codecs alone do not (full-precision sinks or window,
        requantization, eviction, a sparse read), a few words each; empty when every token is
        stored as its codecs pack it. A benchmark that measures the codecs alone (proofs) cannot
        see these: it says so in its report, and a suite's claim on such a case is refused."""
        return []

    def holds_windows(self) -> bool:
        """Its caches hold sliding-window layers too (a quantizer's `layers`); by default they
        hold full-attention layers only, the library the windows (kvbench.models.layer_kinds)."""
        return False

    def asks_every_layer(self) -> bool:
        """It was asked to hold every attention layer (`layers: all`): a model with a layer it
        leaves to the library is refused (kvbench.models.layer_kinds.refusal)."""
        return False

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class KernelSettings:
    """A method whose codecs have Triton kernels: its `impl` field, checked against why its
    layout has none (kernel_unsupported) before anything runs."""

    impl: str

    def kernel_unsupported(self) -> str | None:
        """Why this configuration's codecs have no kernel (None: they have one)."""
        return None

    def kernel_fields(self) -> tuple[str, ...]:
        """The fields that keep this configuration from a kernel: a suite asking for one is
        blamed at the first of them it sets, before impl."""
        return ()

    def check(self) -> None:
        self.check_impl()

    def check_impl(self) -> None:
        try:
            check_impl(self.impl, self.kernel_unsupported())
        except ValueError as exc:
            raise SettingError((*self.kernel_fields(), "impl"), str(exc)) from None


# The built-in methods: each name and its module in kvbench.methods.settings, imported when
# the name is first looked up; plug-ins add theirs by the `kvbench.methods` entry-point group.
BUILTIN_METHODS = {
    "identity": "identity", "intq": "intq", "kivi": "kivi", "lloydmax": "lloydmax",
    "turbo": "turbo", "turbo2": "turbo", "turbo2.5": "turbo", "turbo3": "turbo",
    "turbo3.5": "turbo", "turbo4": "turbo", "butterfly": "butterfly",
    "streamingllm": "eviction", "snapkv": "eviction", "h2o": "eviction", "am": "am",
    "am_task": "am", "sparse_v": "sparse_v", "decay": "decay", "adaptive": "adaptive",
    "kvpress": "kvpress", "hf-quantized": "hf_quantized", "mlx-lm-quantized": "mlx_lm_cache",
    "mlx-lm-rotating": "mlx_lm_cache",
}
METHODS: Registry[MethodSettings] = Registry(
    "method", entry_point_group="kvbench.methods",
    builtins={name: f"kvbench.methods.settings.{module}"
              for name, module in BUILTIN_METHODS.items()})
register_method = METHODS.register


def build_method(name: str, params: dict[str, Any] | None = None) -> MethodSettings:
    """A registered method's settings from its name and parameters, checked as strictly as a
    suite's methods entry ("4" for an int is refused; methods that wrap another method build it
    with this). An unknown name or a bad parameter is a ValueError, so a wrapper's check()
    refuses it like any other bad setting."""
    try:
        cls = METHODS.get(name)
    except LookupError as exc:
        raise ValueError(str(exc)) from None
    return build_strict(cls, params or {})


# ---- implementations, registered against the exact settings class ------------------------------

_IMPLEMENTATIONS: dict[tuple[type, str], Callable[[Any], Any]] = {}


def implements(*settings_classes: type, backend: str = "torch") -> Callable[[type], type]:
    """Register the decorated class, built from a settings object, as the `backend`
    implementation of exactly `settings_classes`: a subclass (a plug-in overriding the
    algorithm) has none until it registers its own, so it never silently runs its parent's.
    A layer cache class (a score-only token method) may be decorated itself: its
    `as_implementation()` makes the implementation that holds one per layer."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")

    def register(cls: type) -> type:
        made = getattr(cls, "as_implementation", None)  # a layer cache: its method is made
        for settings_cls in settings_classes:
            _IMPLEMENTATIONS[(settings_cls, backend)] = made() if made else cls
        return cls
    return register


def registered_implementation(settings_cls: type, backend: str) -> Callable[[Any], Any] | None:
    """The implementation registered for exactly `settings_cls` on `backend`, or None; the
    module the settings name for that backend (`implemented_in`) is imported first, built-ins
    and plug-ins alike (ImportError when the backend itself cannot be imported)."""
    module = getattr(settings_cls, "implemented_in", {}).get(backend)
    if module:
        importlib.import_module(module)
    return _IMPLEMENTATIONS.get((settings_cls, backend))


__all__ = ["BACKENDS", "Capabilities", "DEVICE_TYPES", "IMPL_MEANING", "Impl", "KernelSettings",
           "METHODS", "MethodSettings", "UnknownName", "build_method", "implements",
           "register_method", "registered_implementation"]
