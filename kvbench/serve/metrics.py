"""The Prometheus metrics of `kvbench serve`'s /metrics: the engine's state and totals."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvbench.serve.engine import Engine


def metrics_registry(engine: Engine, method_label: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    registry.register(_EngineCollector(engine, method_label))
    return registry


class _EngineCollector:
    def __init__(self, engine: Engine, method_label: str):
        self.engine, self.method = engine, method_label

    def collect(self):
        state, totals = self.engine.state(), self.engine.totals
        gauges = {
            "kvbench_requests_active": ("requests being decoded", state["active"]),
            "kvbench_requests_queued": ("requests waiting for room", state["queued"]),
            "kvbench_live_caches": ("request caches not yet freed", state["live_caches"]),
            "kvbench_kv_reserved_bytes": ("KV bytes reserved by active requests (budget)",
                                          state["kv_reserved_bytes"]),
            "kvbench_prefix_cache_entries": ("prompt prefixes kept (--prefix-cache)",
                                             state.get("prefix_cache_entries", 0)),
            "kvbench_prefix_cache_bytes": ("bytes of the arrays the kept prefixes hold, outside"
                                           " the KV budget", state.get("prefix_cache_bytes", 0)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, key in (
            ("kvbench_kv_bytes", "KV bytes the active caches hold, as the method accounts them",
             "kv_accounted_bytes"),
            ("kvbench_kv_measured_bytes", "bytes of the arrays the active caches hold",
             "kv_measured_bytes"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["method"])
            gauge.add_metric([self.method], state[key])
            yield gauge
        budget = self.engine.kv_budget
        yield GaugeMetricFamily("kvbench_kv_budget_bytes", "the --kv-budget (0: none)",
                                value=budget or 0)
        for name, doc, value in (
            ("kvbench_prompt_tokens", "prompt tokens prefilled", totals.prompt_tokens),
            ("kvbench_prefix_cache_hits", "prompts started from a kept prefix",
             state.get("prefix_cache_hits", 0)),
            ("kvbench_prefix_cache_reused_tokens", "prompt tokens a kept prefix supplied",
             state.get("prefix_cache_reused_tokens", 0)),
            ("kvbench_generated_tokens", "tokens generated", totals.generated_tokens),
            ("kvbench_decode_steps", "batched decode forwards", totals.decode_steps),
            ("kvbench_decode_rows", "requests summed over decode forwards", totals.decode_rows),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        finished = CounterMetricFamily("kvbench_requests_finished",
                                       "requests that ended, by outcome", labels=["outcome"])
        for outcome, count in sorted(totals.finished.items()):
            finished.add_metric([outcome], count)
        yield finished
