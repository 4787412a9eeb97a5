"""stress with a shared prefix against `kvbench serve --prefix-cache` (a real server on the tiny
model): every prompt begins with the same window, the warm-up request leaves it out, the
single-user pass's later requests and the level's start from the server's copy, the answers
are those of a server without it, and the prefix figures come from the single-user TTFTs."""
import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

from kvbench.benchmarks import measurement  # noqa: E402 - after the skip
from kvbench.benchmarks.measure.stress_requests import make_prompts
from kvbench.benchmarks.specs.stress import PREFIX_METRICS, Stress, StressParams
from kvbench.config.fields import SettingError
from kvbench.methods import build_method, implementation
from kvbench.models.loading import load_tokenizer
from kvbench.memo import Memo
from tests.plugins.model_runs import cpu_context

CHUNK, SHARED = 16, 40
PARAMS = dict(users=2, requests_per_user=1, prompts=3, prompt_tokens=8, max_tokens=4,
              shared_prefix_tokens=SHARED, prefill_chunk=CHUNK)


def test_every_prompt_begins_with_the_same_window():
    tokenizer = load_tokenizer("tiny:llama")
    prompts = make_prompts(Memo(), tokenizer, "tiny:llama", StressParams(**PARAMS), seed=0)
    shared = prompts[0].ids[:SHARED]
    assert all(p.ids[:SHARED] == shared and len(p.ids) == SHARED + 8 for p in prompts)
    assert len({tuple(p.ids[SHARED:]) for p in prompts}) == 3  # their own windows differ


@pytest.mark.parametrize("bad, key", [({"task": "niah_single_1"}, "shared_prefix_tokens"),
                                      ({"prompts": 1}, "prompts"),
                                      ({"server": {"url": "http://127.0.0.1:9"},
                                        "prefix_cache": 4, "shared_prefix_tokens": 0,
                                        "prefill_chunk": 0}, "prefix_cache")])
def test_bad_prefix_settings_are_refused(bad, key):
    with pytest.raises(SettingError) as caught:
        StressParams(**{**PARAMS, **bad}).check()
    assert caught.value.field == key


def run(prefix_cache: int):
    ctx = cpu_context("tiny:llama")
    params = StressParams(**PARAMS, prefix_cache=prefix_cache)
    try:
        return measurement(Stress).run(params, implementation(build_method("intq", {
            "bits": 4, "group_size": 16, "impl": "torch"})), ctx)
    finally:
        ctx.memo.close()


def test_the_shared_prefix_is_reused_and_changes_no_answer():
    reused, plain = run(prefix_cache=4), run(prefix_cache=0)
    shared = SHARED // CHUNK * CHUNK
    # misses: the warm-up (no prefix) and the single-user pass's first; then 2 + 2 hits
    assert reused.info["prefix_cache"]["prefix_cache_misses"] == 2
    assert reused.info["prefix_cache"]["prefix_cache_hits"] == 4
    assert reused.info["prefix_cache"]["prefix_cache_reused_tokens"] == 4 * shared
    assert "prefix_cache" not in plain.info
    assert reused.info["generated"] == plain.info["generated"]
    assert reused.metrics["token_agreement"].value == 1.0
    m = {name: reused.metrics[name].value for name in PREFIX_METRICS}
    assert m["prefix_warm_vs_cold"] == pytest.approx(m["prefix_warm_ttft_s"]
                                                    / m["prefix_cold_ttft_s"])


def test_the_prefix_table_sets_each_cache_against_the_same_method_without_it():
    """reports/stress-prefix re-rendered: a row per method and cache, the ratios its cells show
    computed from the cases' own metrics."""
    from kvbench.benchmarks.reports.stress_prefix import prefix_section
    from kvbench.results import load_results
    from tests.plugins.suites import ROOT

    result = load_results(ROOT / "reports/stress-prefix/results.json")
    text = prefix_section(result)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| intq4")]
    assert [row[1] for row in rows] == ["off", "8"]
    cases = {c.id: c.metrics for c in result.cases}
    warm = cases["stress/intq4/prefix_cache=8"]["prefix_warm_ttft_s"].value
    plain = cases["stress/intq4/prefix_cache=0"]["prefix_warm_ttft_s"].value
    assert rows[1][6] == f"{warm / plain:.2f}" and rows[0][6] == "—"
    assert rows[1][10].startswith("4, ") and rows[0][10].rstrip(" |") == "—"
