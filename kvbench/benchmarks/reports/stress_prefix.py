"""stress's shared-prefix table: per method and prefix cache, the single-user pass's first TTFT
(the shared prefix new to the server) against its later ones (the same prefix again), and the
TTFT under load; where a method ran with the cache and without it, what the cache saves."""
from __future__ import annotations

from kvbench.benchmarks.records.stress import PrefixCacheState, StressRecord
from kvbench.reportkit.tables import finite_metric, fmt_bytes, md_table, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "stress"


def _cache(case: CaseResult) -> int:
    return int(case.bench_params.get("prefix_cache") or 0)


def _users(case: CaseResult) -> int:
    return int(case.bench_params.get("users", 1))


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _times(numerator: float | None, denominator: float | None) -> str:
    return "—" if numerator is None or not denominator else f"{numerator / denominator:.2f}"


def prefix_section(result: RunResult) -> str | None:
    cases = [c for c in ok_cases(result, BENCHMARK)
             if finite_metric(c, "prefix_cold_ttft_s") is not None]
    if not cases:
        return None
    without = {(c.method_label, _users(c)): c for c in cases if not _cache(c)}
    rows = []
    for case in sorted(cases, key=lambda c: (c.method_label, _cache(c), _users(c))):
        warm = finite_metric(case, "prefix_warm_ttft_s")
        loaded = finite_metric(case, "ttft_s_p50")
        plain = without.get((case.method_label, _users(case))) if _cache(case) else None
        kept = StressRecord.of(case).prefix_cache or PrefixCacheState()
        rows.append([
            case.method_label, str(_cache(case) or "off"), str(_users(case)),
            _seconds(finite_metric(case, "prefix_cold_ttft_s")), _seconds(warm),
            _times(warm, finite_metric(case, "prefix_cold_ttft_s")),
            _times(warm, plain and finite_metric(plain, "prefix_warm_ttft_s")),
            _seconds(loaded), _times(loaded, plain and finite_metric(plain, "ttft_s_p50")),
            "—" if kept.prefix_cache_hits is None else str(kept.prefix_cache_hits),
            f"{kept.prefix_cache_entries}, {fmt_bytes(kept.prefix_cache_bytes)}"
            if kept.prefix_cache_entries is not None else "—",
        ])
    header = ["method", "prefix cache", "users", "first TTFT s", "later TTFT s ↓",
              "later / first ↓", "later × no cache ↓", "p50 TTFT under load s ↓",
              "under load × no cache ↓", "server hits", "prefixes kept, bytes"]
    shared = {c.bench_params.get("shared_prefix_tokens") for c in cases}
    text = (f"Every prompt begins with the same {', '.join(map(str, sorted(shared)))}-token"
            " window (`shared_prefix_tokens`, a shared system prompt). *First TTFT*: the"
            " single-user pass's first request, the first with that prefix the server sees (the"
            " warm-up request sends it after its own tokens); *later TTFT*: the median of the pass's other"
            " requests, each with the same prefix. With `prefix_cache` (kvbench serve"
            " --prefix-cache) the server starts them from its copy of the prefix's whole"
            " prefill chunks and prefills the rest, bit for bit as a full prefill, so the"
            " answers are the same and only the time moves. *× no cache*: against the same"
            " method's case without the cache at the same users. *Server hits*: prompts the"
            " server started from a kept prefix by the end of the case; *prefixes kept*: the"
            " copies it held then and their arrays' bytes (reserved room included), outside the"
            " KV budget: the cache's cost in memory.")
    return "\n\n".join(["### Shared prefix", text,
                        md_table(header, rows, set(range(2, len(header))))])
