"""`stress`: N concurrent users against an OpenAI-compatible server on loopback, one concurrency
level per case (a matrix over `users` makes the ladder of levels).

Protocol: `prompts` distinct prompts, each a window of `prompt_tokens` tokens of the text at a
seeded offset. The server (`server: kvbench` starts `kvbench serve` with the case's model and
method; see ServerTarget for the others) gets one warm-up request when it starts, then, once per
server and run, the single-user reference: every prompt answered one request at a time. Then the
level: `users` users start together, each sending `requests_per_user` streamed greedy requests
one after another (user u's j-th asks prompt (u * requests_per_user + j) % prompts, so every
answer has a single-user answer to be compared with). Every response at the level is compared
with the single-user answer to its prompt, token by token: a cache that leaks between sessions
changes confident tokens and is flagged; a near-tie that batching's float order flips is not.

With `task`, the prompts are RULER samples (kvbench.data.ruler's generators, as the ruler
benchmark makes them, framed by the model's chat template with the case's chat options; the
client needs the tokenizer only), each asking its task's tokens_to_generate and ending at an
end-of-sequence id. Every response, under load and in the single-user pass, is scored as RULER
scores it, its reasoning left out; the level's score is set against the single-user answers'
response by response (an exact sign test and a paired interval), and goodput counts the
requests that met the SLOs and were answered correctly. Per prompt, the single-user pass
records its answer's tokens, seconds and score (info.generated, answer_s, scores, beside
prompt_sha256s) for the output-length drift against identity.

With `shared_prefix_tokens`, every prompt begins with the same window: the single-user pass's
first request is the server's first sight of it, its later ones reuse it (`prefix_cache`).

The server is kept running for the next case of the same method (the run's memo holds it and
stops it when the run ends); a case that needs another server stops it first. kvbench never
sends anything to a host other than 127.0.0.1, localhost or ::1: other urls are refused when the
suite is validated.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import MetricSpec, measures
from kvbench.benchmarks.specs.server_target import ServerTarget
from kvbench.benchmarks.specs.stress import (
    METRICS, PER_PASS, PERCENTILE_METHOD, PREFIX_METRICS, TASK_METRICS, Stress, StressParams,
)
from kvbench.benchmarks.measure.kvbench_serve import (
    ServeOptions, kvbench_server, kvbench_server_health, kvbench_server_impl,
)
from kvbench.benchmarks.measure.load_figures import goodput_figures, level_figures
from kvbench.benchmarks.measure.load_generator import (
    Level, Prompt, Reference, candidates_at, compare, count_tokens, generated_tokens, run_level,
    score_records, scored_text,
)
from kvbench.benchmarks.measure.retrieval import METRIC_NAMES
from kvbench.benchmarks.measure.servers import RunningServer, pooled_server, target_key
from kvbench.benchmarks.measure.stress_requests import (
    client_tokenizer, make_long_prompt, make_prompts, make_task_prompts, request_body,
)
from kvbench.data.text import tokens_sha256
from kvbench.judge.intervals import wilson_interval
from kvbench.judge.paired import compare_paired
from kvbench.methods.core.contracts import Implementation

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
KEEP_CHARS = 200  # of each text in a kept record of a differing response


@measures(Stress)
class StressRun(Stress):
    def run(self, params: StressParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        target = params.target
        tokenizer, stops = client_tokenizer(ctx.memo, ctx.model, ctx.model_revision,
                                            ctx.load_options.trust_remote_code)
        chat_key = ctx.chat.key()  # it changes what is asked
        task = params.task_spec
        if task is None:
            prompts = ctx.memo.get(
                ("stress_prompts", ctx.model, params.text, params.offset, params.prompts,
                 params.prompt_tokens, params.shared_prefix_tokens, ctx.seed),
                lambda: make_prompts(ctx.memo, tokenizer, ctx.model, params, ctx.seed))
        else:
            ctx.status(f"{params.prompts} {params.task} samples")
            prompts = ctx.memo.get(
                ("stress_task_prompts", ctx.model, chat_key, params.task, params.task_length,
                 params.prompts, params.data_seed, params.essay if task.needs_essay else None),
                lambda: make_task_prompts(ctx.memo, tokenizer, params, ctx.chat, ctx.model))
        prompts_sha = tokens_sha256([t for p in prompts for t in [-1, *p.ids]])
        key, server, info = self._server(ctx, params, method, target)
        model_name = ctx.model if target.kind == "kvbench" else target.model
        body = partial(request_body, params, target, model_name, chat=ctx.chat)
        path = PATHS[params.api]
        level = partial(run_level, server.url, path, prompts=prompts, body=body,
                        request_timeout_s=params.request_timeout_s,
                        level_timeout_s=params.level_timeout_s, headers=target.auth_headers(),
                        remote=target.remote)
        if not server.warmed:  # the first request pays one-time costs: not in any figure
            ctx.status("warm-up request")
            ids = prompts[0].ids  # as long as a prompt, but not starting with the shared prefix
            ids = ids[params.shared_prefix_tokens:] + ids[:params.shared_prefix_tokens]
            first = replace(prompts[0], text=tokenizer.decode(ids), ids=ids)
            warm = level(prompts=[first], users=1, requests_per_user=1)
            server.warmed = True
            if warm.records[0].error:
                info["warmup_error"] = warm.records[0].error
        ctx.status(f"single-user reference ({params.prompts} prompts)")
        reference = ctx.memo.get(
            ("stress_reference", key, prompts_sha, chat_key, params.api, params.max_tokens,
             params.ignore_eos, params.request_timeout_s),
            lambda: reference_pass(level, prompts, tokenizer, stops, ctx.keep))
        long = None
        if params.long_prompt_tokens:
            long = (ctx.memo.get(("stress_long_prompt", ctx.model, params.text, params.offset,
                                  params.long_prompt_tokens, ctx.seed),
                                 lambda: make_long_prompt(ctx.memo, tokenizer, ctx.model, params,
                                                          ctx.seed)),
                    params.long_prompt_after_s)
        passes = []
        for repeat in range(ctx.repeats):
            ctx.status(f"{params.users} users, repeat {repeat + 1}/{ctx.repeats}")
            passes.append(level(users=params.users,
                                requests_per_user=params.requests_per_user, long=long))
        metrics, summary = self._figures(passes, reference, prompts, tokenizer, stops, params,
                                         ctx)
        info.update(summary)
        info.update(per_prompt_info(prompts, reference, params))
        impl = kvbench_server_impl(server.url) if target.kind == "kvbench" else {}
        if impl:  # what the server's codecs ran: kernels or torch, fused attention or decoded
            info["impl"] = impl
        if params.prefix_cache and target.kind == "kvbench":  # entries, bytes, hits, reuse
            info["prefix_cache"] = kvbench_server_health(server.url, "prefix_cache")
        info.update({
            "single_user_tok_s": reference.output_tok_s,
            "kv_budget": params.kv_budget,
            "percentiles": f"numpy.percentile, method '{PERCENTILE_METHOD}'",
        })
        return BenchmarkOutput(
            metrics=metrics, info=info,
            comparable={"prompts_sha256": prompts_sha, "model": str(ctx.model),
                        "server": target.kind if target.kind == "kvbench"
                        else json.dumps(params.server, sort_keys=True)})

    # ---- the server --------------------------------------------------------------------------

    def _server(self, ctx: RunContext, params: StressParams, method: Implementation,
                target: ServerTarget) -> tuple[tuple, RunningServer, dict[str, Any]]:
        """(the server's key, the running server, what info says of it)."""
        key, label, launch = target_key(target), "", None
        if target.kind == "kvbench":
            key, label, launch = kvbench_server(ctx, method, ServeOptions(
                params.kv_budget, params.prefill_chunk, params.prefix_cache))
        server, info = pooled_server(ctx.memo, ctx.files_dir, target, key, label, launch)
        info["server_uses_method"] = target.kind == "kvbench"
        return key, server, info

    # ---- the figures -------------------------------------------------------------------------

    def _figures(self, passes: list[Level], reference: "SingleUser", prompts: list[Prompt],
                 tokenizer: Any, stops: frozenset[int], params: StressParams,
                 ctx: RunContext) -> tuple[dict, dict[str, Any]]:
        per_pass, agreements = [], []
        pairs: list[list] = []  # [prompt, score under load, score alone] per scored response
        lengths: list[tuple[int, int]] = []  # (generated under load, alone) per response
        differing = flagged = 0
        failures: dict[str, int] = {}
        sources: dict[str, int] = {}
        id_sources: dict[str, int] = {}
        sent = ok = 0
        timed_out = False
        for repeat, level in enumerate(passes):
            records = level.records
            count_tokens(records, tokenizer)
            score_records(records, prompts)
            figures = level_figures(records, level.users)
            figures.update(goodput_figures(records, figures["wall_s"], params.slo_ttft_s,
                                           params.slo_tpot_s))
            figures["aggregate_vs_single"] = figures["output_tok_s"] / reference.output_tok_s
            figures["per_user_vs_single"] = figures["per_user_tok_s"] / reference.output_tok_s
            long = level.long
            figures["long_prompt_ttft_s"] = (long.t_first - long.t_sent if long and long.ok
                                             else math.nan)
            if long is not None:  # a request of the level: its failure is an error
                figures["requests"] += 1
                figures["errors"] += not long.ok
                sent += long.sent
                if not long.ok:
                    reason = "long prompt: " + (long.error.splitlines()[0] or "failed")
                    failures[reason] = failures.get(reason, 0) + 1
            per_pass.append(figures)
            timed_out |= level.timed_out
            for record in records:
                sent += record.sent
                if not record.ok:
                    reason = record.error.splitlines()[0] if record.error else "failed"
                    failures[reason] = failures.get(reason, 0) + 1
                    continue
                ok += 1
                sources[record.count_source] = sources.get(record.count_source, 0) + 1
                id_sources[record.ids_source] = id_sources.get(record.ids_source, 0) + 1
                answer = reference.answers[record.prompt]
                lengths.append((generated_tokens(record, stops),
                                reference.generated[record.prompt]))
                alone = None
                if record.score is not None:
                    alone = reference.scores[record.prompt]
                    pairs.append([record.prompt, record.score, alone])
                result = compare(record.ids, answer, params.tie_margin, params.shift_nats,
                                 record.tops)
                agreements.append(result.agreement)
                if result.identical:
                    continue
                differing += 1
                flagged += result.flagged
                ctx.keep({
                    "users": params.users, "repeat": repeat, "user": record.user,
                    "turn": record.turn, "prompt": record.prompt,
                    "agreement": result.agreement,
                    "first_difference": result.first_difference,
                    "margin_there": result.margin, "difference": result.kind,
                    "flagged": result.flagged,
                    "candidates_there": candidates_at(answer.tops, result.first_difference),
                    "response_candidates_there": candidates_at(record.tops,
                                                               result.first_difference),
                    "response": record.text[:KEEP_CHARS],
                    "single_user": answer.text[:KEEP_CHARS],
                    **({} if alone is None else {"score": record.score, "score_alone": alone}),
                })
        m = self.metrics
        metrics = {name: _median_metric(m[name], [f[name] for f in per_pass])
                   for name in PER_PASS}
        totals = {
            "requests": sum(f["requests"] for f in per_pass),
            "errors": sum(f["errors"] for f in per_pass),
            "output_tokens": sum(f["output_tokens"] for f in per_pass),
            "token_agreement": statistics.fmean(agreements) if agreements else math.nan,
            "responses_differing": differing,
            "responses_flagged": flagged,
            "sessions_held": statistics.median(f["sessions_held"] for f in per_pass),
            "correct_share": goodput_figures([r for level in passes for r in level.records],
                                             math.nan, params.slo_ttft_s,
                                             params.slo_tpot_s)["correct_share"],
            "answer_tokens": _mean([under for under, _ in lengths]),
            "answer_tokens_alone": _mean([alone for _, alone in lengths]),
        }
        paired = score_figures(pairs)
        totals.update(paired.pop("metrics"))
        if params.shared_prefix_tokens:
            totals.update(prefix_figures(reference.ttft_s))
        metrics.update({name: m[name].of(value) for name, value in totals.items()})
        # the table's order; free text has no score, no long-prompt user no long-prompt TTFT
        absent = set() if params.task_spec is not None else set(TASK_METRICS)
        if not params.long_prompt_tokens:
            absent.add("long_prompt_ttft_s")
        if not params.shared_prefix_tokens:
            absent.update(PREFIX_METRICS)
        metrics = {name: metrics[name] for name in METRICS if name not in absent}
        summary = {
            "requests_summary": {"planned": int(totals["requests"]), "sent": sent, "ok": ok,
                                 "failed": int(totals["errors"])},
            "failures": failures,
            "level_timed_out": timed_out,
            "token_count_source": sources,
            "token_ids_source": id_sources,
            "logprobs": reference.has_logprobs,
            "repeats": len(passes),
            **paired,
        }
        return metrics, summary


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def prefix_figures(ttft_s: list[float]) -> dict[str, float]:
    """The prefix metrics from the single-user pass's TTFTs in the order sent (see METRICS)."""
    cold, warm = ttft_s[0], statistics.median(ttft_s[1:])
    return {"prefix_cold_ttft_s": cold, "prefix_warm_ttft_s": warm,
            "prefix_warm_vs_cold": warm / cold}


def score_figures(pairs: list[list]) -> dict[str, Any]:
    """The task samples' figures from [prompt, score under load, score alone] per successful
    response: {"metrics": score with its 95% Wilson interval, score_alone, score_vs_alone} and
    info's "paired" (each pair; the exact sign test's verdict and p, the mean difference and
    its paired bootstrap interval: kvbench.judge.paired). NaN metrics and no "paired" without
    pairs (free text, or no successful response)."""
    if not pairs:
        return {"metrics": {name: math.nan for name in (
            "score", "score_ci_low", "score_ci_high", "score_alone", "score_vs_alone")}}
    under, alone = [p[1] for p in pairs], [p[2] for p in pairs]
    mean = statistics.fmean(under)
    low, high = wilson_interval(mean, len(under))
    comparison = compare_paired(under, alone)
    return {
        "metrics": {"score": mean, "score_ci_low": low, "score_ci_high": high,
                    "score_alone": statistics.fmean(alone),
                    "score_vs_alone": comparison.mean_difference},
        "paired": {
            "of": "each successful response under load against the single-user answer to its"
                  " prompt (score points)",
            "pairs": pairs, "wins": comparison.wins, "losses": comparison.losses,
            "p_value": comparison.p_value, "mean_difference": comparison.mean_difference,
            "low": comparison.low, "high": comparison.high, "verdict": comparison.verdict,
        },
    }


def per_prompt_info(prompts: list[Prompt], reference: "SingleUser",
                    params: StressParams) -> dict[str, Any]:
    """Per prompt, in prompt order, from the single-user pass: its prompt's hash, its answer's
    tokens (end-of-sequence not counted) and seconds (request sent to response finished), and
    with a task its score; and the task's settings."""
    info: dict[str, Any] = {
        "prompt_sha256s": [tokens_sha256(p.ids) for p in prompts],
        "generated": list(reference.generated),
        "answer_s": list(reference.answer_s),
    }
    task = params.task_spec
    if task is not None:
        info.update({
            # not "scores": a paired `score` claim reads that key, and stress's score is under load
            "scores_alone": list(reference.scores),
            "task": params.task,
            "metric": METRIC_NAMES[task.metric],
            "tokens_to_generate": task.tokens_to_generate,
            "prompt_tokens": statistics.fmean(len(p.ids) for p in prompts),
            "slo": {"ttft_s": params.slo_ttft_s or None, "tpot_s": params.slo_tpot_s or None},
        })
    return info


def _median_metric(spec: MetricSpec, values: list[float]):
    """The repeats' median with its samples; NaN when any repeat's is NaN (no successful
    request to time)."""
    if not all(math.isfinite(v) for v in values):
        return spec.of(math.nan)
    return spec.of_samples(values)


# ---- the single-user reference -----------------------------------------------------------------

@dataclass
class SingleUser:
    """The single-user reference pass: each prompt's answer, and the pass's output tok/s; per
    prompt in prompt order (the order sent), its answer's tokens (end-of-sequence not counted),
    seconds (e2e), TTFT and, for task samples, score (None for free text)."""

    answers: dict[int, Reference]
    output_tok_s: float
    has_logprobs: bool
    generated: list[int]
    answer_s: list[float]
    ttft_s: list[float]
    scores: list[float] | None = None


def reference_pass(level: Any, prompts: list[Prompt], tokenizer: Any, stops: frozenset[int],
                   keep: Any = lambda record: None) -> SingleUser:
    """Every prompt once, one request at a time (one user asking them in order); RuntimeError
    naming the failures when any fails (nothing can be compared without them). A task
    sample's answer is scored and kept (keep(its record): predictions.jsonl); an answer's
    tokens end before the id in `stops` that ended it."""
    run = level(users=1, requests_per_user=len(prompts))
    records = run.records
    failed = [f"prompt {r.prompt}: {r.error}" for r in records if not r.ok]
    if failed:
        raise RuntimeError("the single-user reference pass failed, so no response can be"
                           " compared: " + "; ".join(failed[:5]))
    count_tokens(records, tokenizer)
    answers = {r.prompt: Reference(r.ids, r.text, r.tops) for r in records}
    empty = [p for p, a in answers.items() if not a.ids]
    if empty:
        raise RuntimeError(f"the single-user answers to prompts {empty} have no tokens")
    rate = level_figures(records, 1)["output_tok_s"]
    score_records(records, prompts)
    ordered = sorted(records, key=lambda r: r.prompt)
    scores = None
    if all(r.score is not None for r in ordered):
        scores = [r.score for r in ordered]
        for r in ordered:
            task = prompts[r.prompt].task
            keep({"pass": "single user", "prompt": r.prompt,
                  "prompt_sha256": tokens_sha256(prompts[r.prompt].ids), "task": task.name,
                  "prediction": r.text, "scored_text": scored_text(r.text, task),
                  "references": list(task.references), "metric": METRIC_NAMES[task.metric],
                  "score": r.score, "generated": generated_tokens(r, stops)})
    return SingleUser(answers, rate, all(a.tops is not None for a in answers.values()),
                      [generated_tokens(r, stops) for r in ordered],
                      [r.t_end - r.t_sent for r in ordered],
                      [r.t_first - r.t_sent for r in ordered], scores)
