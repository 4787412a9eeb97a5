"""A model-running case's memory footprint (issue 67): the tracker of the method's caches at their
largest on fake caches, the figures' arithmetic, and a real run on the bundled model that records
them, judges a claim on eval_overhead, and reports them in their own table (none for a case that
runs no model, nor for an old results file)."""
from __future__ import annotations

import gc
import textwrap

import pytest

from kvbench.benchmarks import BENCHMARKS
from kvbench.benchmarks.specs.base import FOOTPRINT_METRICS, known_metrics
from kvbench.models import footprint
from kvbench.models.footprint import (
    STEP_GROWTH, STEP_TOKENS, CacheHighWater, CaseFootprint, Reading, observe,
)
from kvbench.report.html import build_site
from kvbench.report.markdown import render_markdown
from kvbench.results import Metric
from kvbench.run.case import footprint_metrics
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite

METHOD, OTHER = object(), object()
BYTES_PER_TOKEN, PLAIN_PER_TOKEN = 10, 40


class Host:
    def __init__(self):
        self.seen_tokens = 0


class FakeCache:
    """accounted_bytes() = 10 per token kept; the plain cache 40 per token seen."""

    def __init__(self, method=METHOD):
        self.method, self.hosts, self.kept = method, [Host()], 0
        self.measured = 0  # accounted_bytes() calls

    def feed(self, tokens: int, tracker_sees: bool = True) -> None:
        self.hosts[0].seen_tokens += tokens
        self.kept += tokens
        if tracker_sees:
            observe(self)

    def accounted_bytes(self) -> int:
        self.measured += 1
        return BYTES_PER_TOKEN * self.kept


def plain(cache: FakeCache) -> int:
    return PLAIN_PER_TOKEN * cache.hosts[0].seen_tokens


@pytest.fixture
def tracker():
    tracked = CacheHighWater(METHOD, plain)
    footprint.track(tracked)
    yield tracked
    footprint.track(None)


# ---------------------------------------------------------------- the tracker


def test_caches_alive_together_are_summed_at_their_largest(tracker):
    a, b = FakeCache(), FakeCache()
    a.feed(100)
    b.feed(50)
    assert (tracker.high, tracker.plain_at_high) == (1500, 6000)
    a.kept = 20  # compacted: the high water stays
    observe(a, settled=True)
    assert (tracker.high, tracker.live()) == (1500, (700, 6000))
    b.feed(100)  # 200 + 1500 > 1500
    assert (tracker.high, tracker.plain_at_high) == (1700, 4000 + 6000)


def test_a_collected_cache_no_longer_counts_and_another_methods_never_does(tracker):
    a = FakeCache()
    a.feed(100)
    del a
    gc.collect()
    b, recording = FakeCache(), FakeCache(OTHER)
    recording.feed(1000)
    b.feed(60)
    assert tracker.live() == (600, 2400)
    assert (tracker.high, tracker.plain_at_high) == (1000, 4000)  # a's, alone


def test_one_token_steps_measure_only_as_the_cache_grows_and_a_flush_catches_up(tracker):
    a = FakeCache()
    a.feed(STEP_GROWTH * 100)  # a prompt: measured
    assert a.measured == 1
    threshold = max(STEP_TOKENS, a.kept // STEP_GROWTH)
    for _ in range(threshold - 1):
        a.feed(1)
    assert a.measured == 1 and tracker.high == BYTES_PER_TOKEN * STEP_GROWTH * 100
    a.feed(1)  # grown by the threshold: measured
    assert a.measured == 2 and tracker.high == BYTES_PER_TOKEN * a.kept
    a.feed(1)
    a.feed(1)
    assert a.measured == 2
    tracker.flush()  # a settled observation, a forward of several tokens or the case's end
    assert a.measured == 3 and tracker.high == BYTES_PER_TOKEN * a.kept


def test_rows_stepped_together_and_a_new_cache_flush_the_rows_left_unmeasured(tracker):
    rows = [FakeCache() for _ in range(3)]
    for row in rows:
        row.feed(10)
    for _ in range(5):  # one batched step a token: every row's seen tokens move by one
        for row in rows:
            row.feed(1, tracker_sees=False)
        observe(*rows)
    assert tracker.high == 3 * 10 * BYTES_PER_TOKEN  # 15 tokens each: below STEP_TOKENS
    FakeCache().feed(0)  # the next sample's cache: the rows are measured first
    assert tracker.high == 3 * 15 * BYTES_PER_TOKEN


def test_a_cache_that_keeps_nothing_yet_still_gives_its_plain_bytes(tracker):
    a = FakeCache()
    a.hosts[0].seen_tokens = 10  # seen, nothing kept: the high water is 0 bytes of 400 plain
    observe(a)
    assert (tracker.high, tracker.plain_at_high) == (0, 400)


def test_a_reset_of_the_probe_restarts_the_high_water_from_the_live_caches(tracker):
    a = FakeCache()
    a.feed(100)
    a.kept = 30
    observe(a, settled=True)
    tracker.restart()
    assert (tracker.high, tracker.at_restart, tracker.plain_at_high) == (300, 300, 4000)


def test_figures_of_a_reading():
    reading = Reading(peak=1000, probe="probe", held_at_start=600, weights=500,
                      cache_high_water=250, plain_cache=400, cache_at_start=50)
    figures = reading.figures()
    assert figures["eval_overhead_bytes"] == 1000 - 600 - (250 - 50)
    assert figures["eval_overhead"] == 200 / 400
    assert reading.figures(peak=700)["eval_overhead_bytes"] == 0  # never below zero
    unplain = Reading(1000, "probe", 600, 500, 0, 0).figures()
    assert "eval_overhead" not in unplain and unplain["eval_overhead_bytes"] == 400


def test_a_benchmarks_own_metric_stands_and_the_overhead_is_figured_from_its_peak():
    reading = Reading(peak=1000, probe="probe", held_at_start=600, weights=500,
                      cache_high_water=100, plain_cache=400)
    own = {"peak_bytes": Metric(value=900.0, unit="bytes")}
    added = footprint_metrics(reading, own)
    assert "peak_bytes" not in added
    assert added["eval_overhead_bytes"].value == 900 - 600 - 100
    assert added["eval_overhead"].unit == FOOTPRINT_METRICS["eval_overhead"].unit


class FakeSession:
    def __init__(self):
        self.resets, self.held, self.peak = 0, 600, 1000

    def reset_peak_memory(self) -> int:
        self.resets += 1
        return self.held

    def peak_memory(self):
        return self.peak, "the fake probe"

    def weights_bytes(self) -> int:
        return 500


def test_a_case_footprint_follows_the_measurements_own_reset_and_stops_tracking():
    session = FakeSession()
    case = CaseFootprint(session, METHOD, plain)
    case.watch(session)
    assert session.resets == 1
    warm = FakeCache()
    warm.feed(100)  # a warm-up, before the measurement resets the probe itself
    del warm
    gc.collect()
    session.held = 700
    assert session.reset_peak_memory() == 700  # the measurement's own reset
    a = FakeCache()
    a.feed(20)
    reading = case.close()
    a.feed(1000)  # after the case: tracked no more
    assert case.caches.high == 200
    assert (reading.held_at_start, reading.cache_high_water, reading.plain_cache) == (700, 200, 800)
    assert reading.figures()["eval_overhead_bytes"] == 1000 - 700 - 200
    assert reading.probe == "the fake probe" and reading.weights == 500


def test_a_case_whose_method_ran_no_cache_reads_nothing():
    case = CaseFootprint(FakeSession(), METHOD, plain)
    FakeCache(OTHER).feed(10)
    assert case.close() is None


# ---------------------------------------------------------------- declared once, for claims


def test_every_model_benchmark_knows_the_footprint_metrics_and_others_do_not():
    for kind in ("perplexity", "ladder", "niah", "quality", "compaction"):
        assert set(FOOTPRINT_METRICS) <= set(known_metrics(BENCHMARKS.get(kind))), kind
    for kind in ("proofs", "speed", "stress"):
        assert not set(FOOTPRINT_METRICS) & set(known_metrics(BENCHMARKS.get(kind))), kind
    ladder = BENCHMARKS.get("ladder")
    assert known_metrics(ladder)["peak_bytes"] is ladder.metrics["peak_bytes"]


def test_a_claim_on_eval_overhead_is_refused_where_the_benchmark_runs_no_model(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.replace("claims: []", 'claims: ["eval_overhead <= 1"]'))
    with pytest.raises(SuiteError, match=r"suite.yaml:\d+: .*does not report.*'eval_overhead'"):
        load_suite(suite)


# ---------------------------------------------------------------- a real run


SUITE = textwrap.dedent("""\
    kvbench: 1
    name: footprint
    defaults: {model: "bundled:smollm2-135m", device: cpu, seed: 0, threads: 1, repeats: 1}
    methods:
      - name: identity
    benchmarks:
      - kind: proofs
        params: {n_vectors: 256, dim: 64}
        claims: []
      - kind: perplexity
        params: {context: 128, continuation: 17, decode_chunk: 8}
        claims: ["eval_overhead <= 1000", "eval_overhead > 1000"]
    """)


@pytest.mark.model
def test_a_run_records_the_footprint_of_its_model_cases_and_reports_it(tmp_path):
    from kvbench.run.runner import run_suite

    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    result = run_suite(load_suite(path), tmp_path / "out").result
    proofs, ppl = result.cases
    assert ppl.status == "ok", ppl.error
    assert proofs.footprint is None and not set(FOOTPRINT_METRICS) & set(proofs.metrics)

    m = {name: metric.value for name, metric in ppl.metrics.items()}
    assert ppl.footprint.metrics == list(FOOTPRINT_METRICS) and ppl.footprint.probe
    # one cache alive: at its largest it is what the benchmark reports it keeps
    assert m["cache_high_water_bytes"] == m["kv_bytes"] > 0
    assert m["plain_cache_bytes"] == m["kv_bytes"]  # identity keeps the plain cache's bytes
    assert m["held_at_start_bytes"] >= m["weights_bytes"] > 0  # the weights are resident
    assert m["peak_bytes"] >= m["held_at_start_bytes"]
    assert m["eval_overhead_bytes"] == max(
        0, m["peak_bytes"] - m["held_at_start_bytes"] - m["cache_high_water_bytes"])
    assert m["eval_overhead"] == m["eval_overhead_bytes"] / m["plain_cache_bytes"]
    verdicts = {claim.claim: (claim.verdict, claim.measured) for claim in ppl.claims}
    assert verdicts == {"eval_overhead <= 1000": ("held", m["eval_overhead"]),
                        "eval_overhead > 1000": ("failed", m["eval_overhead"])}

    report = render_markdown(result)
    table = report.split("## perplexity")[1].split("##")[0]
    assert "kv_bytes" in table and "eval_overhead" not in table  # in its own table
    section = report.split("## Memory footprint")[1].split("##")[0]
    assert "| perplexity/identity |" in section and "proofs/" not in section
    assert f"peak: {ppl.footprint.probe}" in section

    page = build_site([(str(tmp_path / "out" / "results.json"), result)],
                      tmp_path / "site").read_text()
    shown = page.split("<section id='memory-footprint'>")[1].split("</section>")[0]
    assert ">perplexity/identity</a>" in shown and "proofs/" not in shown


def test_an_old_results_file_reports_no_footprint(small):
    assert all(case.footprint is None for case in small.cases)
    assert "Memory footprint" not in render_markdown(small)


@pytest.mark.parametrize("name, params", [("identity", {}), ("intq", {"bits": 4}),
                                          ("h2o", {"ratio": 0.5})])
def test_a_dropped_cache_is_freed_at_once_not_by_the_garbage_collector(tiny_sessions, name,
                                                                        params):
    """No reference cycle holds a cache: one a sample let go is not in what the next holds."""
    import weakref

    from kvbench.methods import build_method, implementation
    from kvbench.models.session import prefill

    session = tiny_sessions("llama")
    method = implementation(build_method(name, params), "torch")
    cache = session.new_cache(method)
    prefill(session, cache, list(range(5, 69)), method, chunk=16)
    session.step([7], cache)
    gc.disable()
    try:
        dropped = weakref.ref(cache)
        del cache
        assert dropped() is None
    finally:
        gc.enable()


def test_each_method_is_warmed_up_once_a_run_before_its_first_cases_footprint(tmp_path,
                                                                              monkeypatch):
    """The one-time set-up (kernels compiled at first use, numba's own start ~100 MB) happens
    before the first case of a method resets its probe: no case counts it as its evaluation."""
    from kvbench.benchmarks.measure import context
    from kvbench.models import footprint
    from kvbench.run.runner import run_suite

    order, warm, begin = [], context.warm_up, footprint.CaseFootprint.__init__
    monkeypatch.setattr(context, "warm_up",
                        lambda session, method: order.append(method.name) or warm(session,
                                                                                  method))
    monkeypatch.setattr(footprint.CaseFootprint, "__init__",
                        lambda self, *a: order.append("footprint") or begin(self, *a))
    path = tmp_path / "suite.yaml"
    path.write_text(textwrap.dedent("""\
        kvbench: 1
        name: warm-up
        defaults: {model: "bundled:smollm2-135m", device: cpu, seed: 0, threads: 1}
        methods: [{name: identity}, {name: intq}]
        benchmarks:
          - kind: perplexity
            params: {continuation: 9, decode_chunk: 8}
            matrix: {context: [64, 96]}
        """))
    run_suite(load_suite(path), tmp_path / "out")
    assert order == ["identity", "footprint", "intq", "footprint", "footprint", "footprint"]


@pytest.mark.parametrize("name, params", [("intq", {"bits": 4}), ("kivi", {}),
                                          ("lloydmax", {})])
def test_a_warm_up_leaves_a_case_nothing_to_compile(tiny_sessions, name, params):
    """After warm_up, a longer prompt, a decode step and a batched step of two rows through the
    method's caches compile no kernel of their own: the warm-up took every path they take."""
    pytest.importorskip("numba", reason="the CPU kernels need numba")
    from kvbench.kernels.cpu import attention, batched, channel, row_decode
    from kvbench.methods import build_method, implementation
    from kvbench.models.session import prefill
    from kvbench.models.warm_up import filler_tokens, warm_up

    compilers = [f for module in (attention, batched, channel, row_decode)
                 for f in vars(module).values() if hasattr(f, "cache_clear")]
    for compiler in compilers:
        compiler.cache_clear()
    session = tiny_sessions("llama")
    method = implementation(build_method(name, params), "torch")
    warm_up(session, method)
    compiled = [f.cache_info().currsize for f in compilers]
    assert sum(compiled) > 0
    caches = [session.new_cache(method) for _ in range(2)]
    for cache in caches:
        prefill(session, cache, filler_tokens(session, 900), method, chunk=256)
    session.step([5], caches[0])
    session.step_rows([5, 6], caches)
    assert [f.cache_info().currsize for f in compilers] == compiled
