"""A stress level's figures from its records: throughput, latency percentiles, SLOs, goodput."""
from __future__ import annotations

import math

import numpy as np

from kvbench.benchmarks.measure.load_generator import RequestRecord
from kvbench.benchmarks.specs.stress import CORRECT, PERCENTILE_METHOD, PERCENTILES


def percentiles(values: list[float]) -> dict[int, float]:
    """p50 / p90 / p99 of `values` (numpy, method PERCENTILE_METHOD); NaN for none."""
    if not values:
        return {q: math.nan for q in PERCENTILES}
    got = np.percentile(np.asarray(values, dtype=float), PERCENTILES, method=PERCENTILE_METHOD)
    return {q: float(v) for q, v in zip(PERCENTILES, got)}


def sessions_held(records: list[RequestRecord]) -> int:
    """The most successful requests that had received their first token and not yet finished at
    the same moment ([t_first, t_end): one ending as another starts is not an overlap)."""
    events = sorted([(r.t_first, 1) for r in records if r.ok]
                    + [(r.t_end, -1) for r in records if r.ok])  # -1 sorts first at a tie
    held = most = 0
    for _, step in events:
        held += step
        most = max(most, held)
    return most


def time_per_output_token(record: RequestRecord) -> float | None:
    """(e2e - ttft) / (output tokens - 1): the time per output token after the first; None
    under two tokens."""
    if record.output_tokens < 2:
        return None
    return (record.t_end - record.t_first) / (record.output_tokens - 1)


def chunk_gaps(record: RequestRecord) -> list[float]:
    times = record.chunk_times
    return [b - a for a, b in zip(times, times[1:])]


def level_figures(records: list[RequestRecord], users: int) -> dict[str, float]:
    """The level's throughput, latency percentiles and counts (tokens counted first). Only
    successful requests count in tokens and latencies; the wall time runs from the first
    request sent to the last one finished, failed ones included."""
    ok = [r for r in records if r.ok]
    sent = [r for r in records if r.sent and r.t_end is not None]
    wall = (max(r.t_end for r in sent) - min(r.t_sent for r in sent)) if sent else math.nan
    tokens = sum(r.output_tokens for r in ok)
    per_user = []
    for user in range(users):
        mine = [r for r in sent if r.user == user]
        busy = (max(r.t_end for r in mine) - min(r.t_sent for r in mine)) if mine else 0.0
        done = sum(r.output_tokens for r in mine if r.ok)
        per_user.append(done / busy if busy > 0 else 0.0)
    rate = (lambda n: n / wall) if wall > 0 else (lambda n: math.nan)
    out = {
        "output_tok_s": rate(tokens),
        "per_user_tok_s": float(np.mean(per_user)) if per_user else math.nan,
        "request_throughput": rate(len(ok)),
        "wall_s": wall,
        "output_tokens": float(tokens),
        "requests": float(len(records)),
        "errors": float(len(records) - len(ok)),
        "sessions_held": float(sessions_held(records)),
    }
    series = {
        "ttft_s": [r.t_first - r.t_sent for r in ok],
        "tpot_s": [t for t in map(time_per_output_token, ok) if t is not None],
        "chunk_gap_s": [gap for r in ok for gap in chunk_gaps(r)],
        "e2e_s": [r.t_end - r.t_sent for r in ok],
    }
    for name, values in series.items():
        for q, value in percentiles(values).items():
            out[f"{name}_p{q}"] = value
    # a stall of every stream at once (a long prefill) is a handful of gaps among hundreds:
    # under the p99 when fewer than 1 in 100, so the largest is its own figure
    out["chunk_gap_s_max"] = max(series["chunk_gap_s"], default=math.nan)
    return out


# ---- task samples: SLOs and goodput -------------------------------------------------------------

def meets_slos(record: RequestRecord, slo_ttft_s: float | None,
               slo_tpot_s: float | None) -> bool:
    """Whether a request succeeded within the SLOs: its TTFT at most slo_ttft_s and its TPOT at
    most slo_tpot_s (None or 0: no such SLO; a response of one token has no TPOT to miss).
    Output tokens counted first."""
    if not record.ok:
        return False
    if slo_ttft_s and record.t_first - record.t_sent > slo_ttft_s:
        return False
    tpot = time_per_output_token(record)
    return not (slo_tpot_s and tpot is not None and tpot > slo_tpot_s)


def goodput_figures(records: list[RequestRecord], wall_s: float, slo_ttft_s: float | None,
                    slo_tpot_s: float | None) -> dict[str, float]:
    """goodput_rps: requests that met both SLOs and were answered correctly (score == CORRECT)
    / wall_s; slo_attainment: the share of the records meeting both SLOs; correct_share: the
    share answered correctly. Failed records count in every share's whole and in none of its
    parts. goodput and correct_share are NaN when no successful record has a score (free text);
    every figure is NaN without records."""
    if not records:
        return {"goodput_rps": math.nan, "slo_attainment": math.nan, "correct_share": math.nan}
    met = [r for r in records if meets_slos(r, slo_ttft_s, slo_tpot_s)]
    scored = any(r.ok and r.score is not None for r in records)
    correct = [r for r in records if r.ok and r.score == CORRECT]
    good = [r for r in met if r.score == CORRECT]
    return {
        "goodput_rps": (len(good) / wall_s if wall_s > 0 else math.nan) if scored else math.nan,
        "slo_attainment": len(met) / len(records),
        "correct_share": len(correct) / len(records) if scored else math.nan,
    }
