"""`kvpress`: a press from NVIDIA's kvpress library, run unchanged (kvbench.methods.external.kvpress
runs it)."""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.extras import lacks
from kvbench.config.fields import LibraryMissing, SettingError, between, param
from kvbench.methods.settings.base import Capabilities, MethodSettings, register_method

ENVIRONMENT = "kvpress 0.5 needs transformers<5.3: `make test-kvpress` builds .venv-kvpress"


@register_method("kvpress")
@dataclass
class KVPress(MethodSettings):
    """A kvpress press (github.com/NVIDIA/kvpress), run as its own pipeline runs it: the prompt
    is fed in one forward with the press's hooks on the model and a transformers DynamicCache,
    the press compresses each layer's cache after that layer's attention, and the keys and
    values it leaves become the cache kvbench decodes through (full precision; positions go on
    from the prompt's length, as the pipeline's position_ids do). Bytes are those of the kept
    keys and values. In a suite: `{name: kvpress, params: {press: SnapKVPress,
    compression_ratio: 0.75, args: {window_size: 32}}}`.

    A press compresses the first forward of a prompt only (kvpress's is_prefilling), so a
    benchmark that feeds the prompt in chunks is refused (the server feeds such a method's
    prompts whole). Presses that change the model beyond a forward hook (their own __call__:
    decoding presses, KVzip, Finch, ...) and those in UNHOSTED are refused with the reason when
    the suite is validated.
    """

    implemented_in: ClassVar[dict[str, str]] = {"torch": "kvbench.methods.external.kvpress"}
    library_cache: ClassVar[bool] = True
    extra: ClassVar[str | None] = "kvpress"
    capabilities: ClassVar[Capabilities] = Capabilities(chunked_prefill=False,
                                                        devices=("cpu", "cuda"))
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"press": "KnormPress", "compression_ratio": 0.5},
        {"press": "SnapKVPress", "compression_ratio": 0.5, "args": {"window_size": 4}})

    press: str = param("SnapKVPress", meaning="the press's class name in kvpress, or"
                       " \"module:Class\" for a press of your own (a kvpress BasePress)")
    compression_ratio: float | None = param(
        None, range=between(0, 1, high_open=True),
        meaning="the fraction of the prompt's tokens the press removes (its compression_ratio;"
        " unset: the press's default)")
    args: dict[str, Any] = param(factory=dict, meaning="other keyword arguments of the press's"
                                 " constructor, e.g. {window_size: 32, kernel_size: 7}")

    def check(self) -> None:
        self.build_press()  # names the install error, the unknown press or argument first

    def build_press(self) -> Any:
        """A new press of this configuration, built by kvpress's own classes. An argument that
        is itself a press (BlockPress's `press`, ComposedPress's `presses`) is written as a
        mapping with its class under `press`: {press: SnapKVPress, compression_ratio: 0.5}."""
        kwargs = dict(self.args)
        if self.compression_ratio is not None:
            if "compression_ratio" in kwargs:
                raise SettingError("args", "compression_ratio is set twice: at the top level and"
                                           " in args")
            kwargs["compression_ratio"] = self.compression_ratio
        return _press(self.press, kwargs, "press")

    def rerotates(self) -> bool:
        """Whether the press moves the kept keys to positions 0.. (KeyRerotationPress): the
        pipeline then continues positions from the kept count, not the prompt's length."""
        return self.press == "KeyRerotationPress"

    def describe(self) -> str:
        inner = ", ".join(f"{key}={value}" for key, value in self.args.items())
        ratio = "" if self.compression_ratio is None else f" {self.compression_ratio:g}"
        return f"{self.press}{ratio}" + (f" ({inner})" if inner else "")

    def layout(self) -> str:
        return (f"kvpress {self.describe()}: the tokens the press keeps per head at full"
                " precision; K and V both counted")


# Presses the adapter refuses, and why: they hold the cache some other way than by removing
# tokens after the prompt's forward, or need what this machine cannot give them.
_MASKS = "it keeps every key and hides some from kvpress's patched attention"
_UNEVEN = ("its layers keep different counts, which SDPA's one mask cannot serve (kvpress's own"
           " pipeline fails the same way with SDPA)")
UNHOSTED = {
    "AdaKVPress": f"{_MASKS}: its cache is not smaller",
    "CriticalAdaKVPress": f"{_MASKS}: its cache is not smaller",
    "DuoAttentionPress": f"{_MASKS}, and loads its head patterns from the Hugging Face hub",
    "ObservedAttentionPress": "it reads the attention weights, which only eager attention"
                              " returns",
    "QFilterPress": "it downloads its Q-filters from the Hugging Face hub",
    "KVzapPress": "it downloads its trained scorer from the Hugging Face hub",
    "ExpectedAttentionStatsPress": "it downloads a dataset for its statistics",
    "DMSPress": "it compresses while decoding, which kvbench's session does not hand it",
    "PyramidKVPress": _UNEVEN,
    "ChunkKVPress": _UNEVEN,
}


def _press(name: str, kwargs: dict[str, Any], blamed: str) -> Any:
    """kvpress's press `name` built with `kwargs`; a SettingError blames `blamed` for the name,
    and args for the arguments."""
    presses = _kvpress()
    base = presses.BasePress
    own = ":" in name
    cls = _own_press(name, blamed) if own else getattr(presses, name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        if own:
            raise SettingError(blamed, f"{name} is not a press (a subclass of kvpress's"
                                       " BasePress)")
        known = sorted(n for n in dir(presses) if n.endswith("Press") and n not in UNHOSTED
                       and isinstance(getattr(presses, n), type))
        raise SettingError(blamed, f"kvpress has no press {name!r}; it has {', '.join(known)}")
    if name in UNHOSTED or cls.__call__ is not base.__call__:
        why = UNHOSTED.get(name, "it changes the model beyond a forward hook (its own __call__)")
        raise SettingError(blamed, f"{name} cannot run under kvbench: {why}")
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise SettingError("args", f"{name} takes no {', '.join(unknown)}; it takes"
                                  f" {', '.join(sorted(names)) or 'nothing'}")
    built = {key: _nested(value) for key, value in kwargs.items()}
    try:
        return cls(**built)
    except (TypeError, ValueError, AssertionError) as exc:
        raise SettingError("args", f"{name}({kwargs}): {exc}") from None


def _own_press(path: str, blamed: str) -> Any:
    """The class at "module:Class" (a press written for kvpress that kvpress does not ship)."""
    module, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise SettingError(blamed, f"cannot load the press {path!r}: {exc}") from None


def _nested(value: Any) -> Any:
    """A press written as {press: Name, ...its arguments}, or a list of them; else the value."""
    if isinstance(value, list):
        return [_nested(item) for item in value]
    if isinstance(value, dict) and isinstance(value.get("press"), str):
        inner = dict(value)
        return _press(inner.pop("press"), inner, "args")
    return value


def _kvpress() -> Any:
    """The kvpress module; SettingError naming the install line where it is absent or broken."""
    missing = lacks("kvpress", "method 'kvpress'")
    if missing:
        raise LibraryMissing("press", f"{missing} ({ENVIRONMENT})")
    try:
        return importlib.import_module("kvpress")
    except Exception as exc:  # noqa: BLE001 - an installed kvpress that fails to import says why
        raise LibraryMissing("press", f"kvpress does not import ({type(exc).__name__}: {exc});"
                                      f" {ENVIRONMENT}") from None
