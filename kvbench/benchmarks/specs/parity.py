"""`parity`: incremental decode through the cache against a full recompute of the same
sequence."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import SettingError, at_least, param
from kvbench.benchmarks.records.parity import ParityRecord
from kvbench.benchmarks.specs.base import (
    MetricSpec, TextModelBenchmark, TextWindowParams, register_benchmark,
)


@dataclass
class ParityParams(TextWindowParams):
    """Parameters of the parity benchmark, and TextWindowParams' text, offset and calibration."""

    context: int = param(100, range=at_least(1),
                         meaning="prompt tokens prefilled before decoding (any length)")
    steps: int = param(16, range=at_least(1),
                       meaning="tokens decoded one at a time through the cache")
    trim: int = param(0, range=at_least(0), rule="below context", meaning="after the prefill,"
                      " rewind the cache by this many tokens and feed them again: the re-fed"
                      " tokens must get their positions back. Methods that cannot take tokens"
                      " back (compressed ones) refuse a trim")

    def check(self) -> None:
        if self.trim >= self.context:
            raise SettingError("trim", f"trim must be below context ({self.context}), got"
                                       f" {self.trim!r}")
        super().check()


@register_benchmark("parity")
class Parity(TextModelBenchmark):
    """Incremental decode through the cache against a full recompute of the same sequence."""
    measured_in = "kvbench.benchmarks.measure.parity"
    record = ParityRecord

    Params = ParityParams
    needs = {"trim": ("trim", 0)}
    metrics = {
        "max_logit_diff": MetricSpec(
            "logit", "lower", "max |logit_cached - logit_full|, all steps"),
        "own_attention_max_logit_diff": MetricSpec(
            "logit", "lower", "max |logit_cached - logit_full| with the full forward through the"
            " model's own attention (transformers' eager), all steps"),
        "own_decode_max_logit_diff": MetricSpec(
            "logit", "lower", "max |logit_cached - logit_own_decode|: the same tokens fed one"
            " at a time through the model's own attention and its own cache, all steps (the"
            " reference where a model's full forward and its decode differ, as Zamba 2's)"),
        "layers_compressed": MetricSpec(
            "layers", "none", "layers whose keys and values the method's policies hold (the"
            " others are the library's: a sliding window with layers: full, a Mamba state)"),
        "mean_kl": MetricSpec("nats", "lower", "mean over steps of KL(full || cached)"),
        "max_kl": MetricSpec("nats", "lower", "largest KL(full || cached) of any step"),
        "greedy_agreement": MetricSpec(
            "", "higher", "fraction of steps where the full recompute picks the cached token"),
        "first_divergence": MetricSpec(
            "steps", "higher", "steps before the full recompute first picks another token"),
    }

    def tokens_read(self, params: ParityParams) -> tuple[str, int, tuple[str, ...]]:
        return "context + steps", params.context + params.steps, ("context", "steps")
