"""The retrieval benchmarks (ruler, niah): prompts framed and answered through the cache in the
order each compress setting promises, the greedy loop as transformers' own, lengths that include
tokens_to_generate, predictions kept beside the results, bad settings refused at load, the two
codec read paths giving the same answers, and the same prompts and answers on MLX."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.memo import Memo
from kvbench.benchmarks.measure.answering import (
    ChatFrame, Prompt, answer_all, decode_rows, frame,
)
from kvbench.benchmarks.specs.niah import Niah, NiahParams
from kvbench.benchmarks.specs.ruler import Ruler, RulerParams
from kvbench.config.fields import SettingError, one_of
from kvbench.data.ruler import TASKS
from kvbench.methods import implementation
from kvbench.methods.settings.base import build_method
from kvbench.run.files import PREDICTIONS
from kvbench.run.runner import run_suite
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.model_runs import cpu_context
from tests.plugins.suites import line_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = "tiny:llama"
EOS = 0


class _ScriptedSession:
    """A Session whose model answers a fixed token script; it records every call."""

    num_kv_heads, head_dim, value_dim, kv_element_size = 1, 2, 2, 4
    layer_kinds: list = []  # a plain model
    stop_ids = frozenset({EOS})

    def __init__(self, script: list[int]):
        self.script, self.calls = iter(script), []
        self.tokenizer = SimpleNamespace(
            eos_token_id=EOS, decode=lambda ids, skip_special_tokens: ",".join(map(str, ids)))

    def new_cache(self, method, decoded_reads=False):
        policy = SimpleNamespace(seen_tokens=0)
        self.cache = SimpleNamespace(policies=[policy], plain_tokens=lambda: policy.seen_tokens,
                                     accounted_bytes=lambda: 8, library_bytes=lambda: 0,
                                     decoded_reads=False)
        return self.cache

    def step(self, ids, cache, last_only=False):
        self.calls.append(("step", list(ids)))
        cache.policies[0].seen_tokens += len(ids)
        logits = torch.zeros(1, 10)
        logits[0, next(self.script)] = 1.0
        return logits, 0.0

    def step_rows(self, ids, caches):
        self.calls.append(("rows", list(ids)))
        return torch.cat([self.step([token], cache)[0] for token, cache in zip(ids, caches)])

    def begin_prompt(self, cache, tokens):
        pass

    def reserve(self, cache, tokens):
        self.reserved = tokens

    def end_prefill(self, cache):
        self.calls.append(("end_prefill",))
        return 0.0


@pytest.mark.parametrize("compress, script, calls", [
    # 9: what the context's own logits say, never used (the question follows it)
    ("context", [9, 5, 6, EOS], [("step", [1, 2]), ("end_prefill",), ("step", [3]),
                                 ("rows", [5]), ("step", [5]), ("rows", [6]), ("step", [6])]),
    ("context+question", [5, 6, EOS], [("step", [1, 2, 3]), ("end_prefill",), ("rows", [5]),
                                       ("step", [5]), ("rows", [6]), ("step", [6])]),
])
def test_the_question_is_fed_after_compression_only_under_context(compress, script, calls):
    session = _ScriptedSession(script)
    [reply] = answer_all(session, implementation(build_method("identity")),
                         [Prompt([1, 2], [3])], compress, [10])
    assert session.calls == calls
    assert session.reserved == 3 + 10  # the whole prompt and the most it may answer
    assert reply.text == "5,6" and reply.generated == 2  # stopped at end-of-sequence
    # 16-bit K+V of every token seen: 2 (K, V) x 2 bytes x 1 head x 2 dims x 5 tokens
    assert reply.bytes_16bit == 2 * 2 * 2 * 5 and reply.kv_bytes == 8


def test_decoding_stops_at_tokens_to_generate_without_a_wasted_step():
    session = _ScriptedSession([9, 5, 6, 7])
    [reply] = answer_all(session, implementation(build_method("identity")), [Prompt([1], [2])],
                         "context", [2])
    assert reply.text == "5,6"
    assert session.calls[-1] == ("step", [5])  # the second token is never fed


def test_rows_decode_together_and_each_stops_on_its_own():
    # prefills: row 0's question answers 5, row 1's 7; then each step feeds the rows still going
    script = [9, 5, 9, 7, 6, 8, 4, EOS]
    session = _ScriptedSession(script)
    replies = answer_all(session, implementation(build_method("identity")),
                         [Prompt([1], [2]), Prompt([1, 1], [2])], "context", [2, 10])
    rows = [call for call in session.calls if call[0] == "rows"]
    assert rows == [("rows", [5, 7]), ("rows", [8]), ("rows", [4])]
    # row 0 stops at its budget (2 tokens, its second never fed); row 1 at end-of-sequence
    assert [r.text for r in replies] == ["5,6", "7,8,4"]


def test_decoded_rows_say_which_tokens_the_cache_has_not_read():
    # row 0 stops at its most (2 tokens: its last never fed), row 1 at end-of-sequence (every
    # token it generated was fed, the end-of-sequence token is not one of them)
    session = _ScriptedSession([6, 8, EOS])  # what each batched step answers, row by row
    caches = [session.new_cache(None), session.new_cache(None)]
    first = torch.zeros(2, 10)
    first[0, 5], first[1, 7] = 1.0, 1.0
    rows = decode_rows(session, caches, list(first), [2, 10])
    assert [(r.tokens, r.unfed) for r in rows] == [([5, 6], [6]), ([7, 8], [])]
    assert [call for call in session.calls if call[0] == "rows"] == [("rows", [5, 7]),
                                                                     ("rows", [8])]


@pytest.mark.model
def test_the_prompt_is_the_chat_template_around_the_task_text(bundled):
    tokenizer = bundled.tokenizer
    prompt = frame(tokenizer, ChatFrame.of(tokenizer), "Remember: the code is 4417.",
                   "\nWhat is the code?", " The code is")
    whole = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Remember: the code is 4417.\nWhat is the code?"}],
        tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt.ids) == whole + " The code is"
    assert tokenizer.decode(prompt.question).startswith("\nWhat is the code?<|im_end|>")


@pytest.mark.model
def test_the_greedy_answer_is_what_transformers_generates(bundled):
    from kvbench.models.session import TorchSession

    tokenizer = bundled.tokenizer
    prompt = frame(tokenizer, ChatFrame.of(tokenizer), "Remember: the code is 4417.",
                   "\nWhat is the code?", " The code is")
    session = TorchSession(bundled, torch.device("cpu"))
    for compress in ("context", "context+question"):
        [reply] = answer_all(session, implementation(build_method("identity")), [prompt],
                             compress, [12])
        with torch.inference_mode():
            out = bundled.model.generate(torch.tensor([prompt.ids]), max_new_tokens=12,
                                         do_sample=False, eos_token_id=tokenizer.eos_token_id)
        expected = out[0, len(prompt.ids):].tolist()
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)


def _ruler(method: str, backend: str = "torch", keep=None, **params):
    ctx = cpu_context(TINY, backend=backend)
    if keep is not None:
        ctx.keep = keep
    settings = build_method(method, {"bits": 4} if method == "intq" else {})
    return measurement(Ruler).run(RulerParams(**params), implementation(settings, backend), ctx)


def test_a_ruler_prompt_fills_its_length_with_tokens_to_generate_counted():
    kept = []
    out = _ruler("identity", keep=kept.append, task="vt", length=2000, samples=2)
    spec = TASKS["vt"]
    for record in kept:
        assert 0.99 * 2000 <= record["prompt_tokens"] + spec.tokens_to_generate <= 2000
    assert [r["score"] for r in kept] == out.info["scores"]
    # per sample, beside its score: what output-length drift is paired on
    assert [r["generated"] for r in kept] == out.info["generated"]
    assert len(out.info["answer_s"]) == 2 and all(s > 0 for s in out.info["answer_s"])
    assert out.metrics["generated_tokens"].value == sum(out.info["generated"]) / 2
    assert out.metrics["score"].value == sum(out.info["scores"]) / 2
    low, high = out.metrics["score_ci_low"].value, out.metrics["score_ci_high"].value
    assert 0 <= low <= out.metrics["score"].value <= high <= 100 and high - low > 10


@pytest.mark.parametrize("half_width, answered", [(None, 40), (10, 16), (9, 32)])
def test_a_case_sampled_to_a_precision_stops_when_its_interval_is_narrow(half_width, answered):
    # the tiny model finds no needle: after 16 samples the 95% Wilson interval of 0 is
    # [0, 19.4] (half-width 9.7), after 32 [0, 10.7] (5.4); checked after each group of 16
    kept = []
    out = _ruler("identity", keep=kept.append, task="niah_single_2", length=1500, samples=40,
                 half_width=half_width, min_samples=4)
    assert len(kept) == len(out.info["scores"]) == len(out.info["prompt_sha256s"]) == answered
    assert out.info["scores"] == [0.0] * answered
    low, high = out.metrics["score_ci_low"].value, out.metrics["score_ci_high"].value
    assert half_width is None or (high - low) / 2 <= half_width
    assert out.info["stopped"].startswith(f"{answered} samples")


def test_min_samples_above_samples_is_refused():
    with pytest.raises(SettingError, match="min_samples 50 is above samples 40"):
        RulerParams(samples=40, half_width=10, min_samples=50)


def test_codec_reads_decoded_once_answer_exactly_as_packed():
    runs = {}
    for reads in ("packed", "decoded"):
        kept = []
        out = _ruler("intq", keep=kept.append, task="niah_single_1", length=800, samples=2,
                     reads=reads)
        runs[reads] = (kept, out)
    (packed, p_out), (decoded, d_out) = runs["packed"], runs["decoded"]
    assert [r["prediction"] for r in packed] == [r["prediction"] for r in decoded]
    assert p_out.metrics["compression_ratio"].value == d_out.metrics["compression_ratio"].value
    assert (p_out.info["codec_reads"], d_out.info["codec_reads"]) == ("packed", "decoded once")
    # a policy with nothing packed has no such path: said so, not called "packed"
    plain = _ruler("identity", task="niah_single_1", length=800, samples=1)
    assert plain.info["codec_reads"] == "as stored (no decoded-once path)"


@pytest.mark.parametrize("kind", ["ruler", "niah"])
def test_mlx_answers_the_same_prompts_the_same(kind):
    pytest.importorskip("mlx.core")
    outs = []
    for backend in ("torch", "mlx"):
        kept = []
        ctx = cpu_context(TINY, backend=backend)
        ctx.keep = kept.append
        if kind == "ruler":
            out = measurement(Ruler).run(
                RulerParams(task="niah_multikey_2", length=800, samples=2),
                implementation(build_method("identity"), backend), ctx)
        else:
            out = measurement(Niah).run(NiahParams(lengths=[1500, 2000], depths=[0, 100]),
                                        implementation(build_method("identity"), backend), ctx)
        outs.append((out, kept))
    (t_out, t_kept), (m_out, m_kept) = outs
    assert t_out.comparable["prompts_sha256"] == m_out.comparable["prompts_sha256"]
    assert [r["prediction"] for r in t_kept] == [r["prediction"] for r in m_kept]
    assert t_out.metrics["score"].value == m_out.metrics["score"].value
    assert t_out.metrics["compression_ratio"].value == m_out.metrics["compression_ratio"].value


NIAH_SUITE = """\
kvbench: 1
name: retrieval
defaults: {model: "tiny:llama", device: cpu}
methods:
  - {name: identity}
  - {name: streamingllm, params: {ratio: 0.25}}
benchmarks:
  - kind: niah
    params: {lengths: [1500, 2000], depths: [0, 50, 100]}
"""


def test_a_run_keeps_every_prediction_beside_its_results(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(NIAH_SUITE)
    outcome = run_suite(load_suite(path), tmp_path / "out")
    lines = [json.loads(line) for line in (tmp_path / "out" / PREDICTIONS).read_text().splitlines()]
    for case in outcome.result.cases:
        assert case.status == "ok", case.error
        mine = [line for line in lines if line["case"] == case.id]
        assert len(mine) == 6  # 2 lengths x 3 depths, one needle each
        # per sample in the order drawn (by length, then depth): the report pairs them so
        assert case.info["scores"] == [line["score"] for line in mine]
        assert [line["length"] for line in mine] == [1500] * 3 + [2000] * 3
        grid = case.info["grid"]
        assert grid["lengths"] == [1500, 2000] and grid["depths"] == [0, 50, 100]
        for line in mine:
            row, col = grid["depths"].index(line["depth"]), grid["lengths"].index(line["length"])
            assert grid["scores"][row][col] == line["score"]
            assert line["references"] and line["prediction"] is not None
            # placed at the sentence boundary nearest the depth: a few sentences on the tiny
            # model's byte tokens
            assert line["depths"] == [pytest.approx(line["depth"], abs=15)]
    streaming = outcome.result.cases[1]
    assert streaming.metrics["compression_ratio"].value > 2 * (
        outcome.result.cases[0].metrics["compression_ratio"].value)


@pytest.mark.parametrize("body, key, message", [
    ("kind: ruler\n    params: {task: qa_1}", "task: qa_1", "qa_data"),
    ("kind: ruler\n    params: {task: niah_single_1, length: 9000}", "length: 9000",
     "above the 4096"),
    ("kind: ruler\n    params: {task: needles}", "task: needles",
     f"task must be {one_of(*TASKS)}, got 'needles'"),
    ("kind: niah\n    params: {depths: [50, 120]}", "depths", "0 to 100"),
    ("kind: ruler\n    params: {compress: question}", "compress",
     "compress: must be 'context' or 'context+question'"),
])
def test_bad_retrieval_settings_are_refused_at_their_line(tmp_path, body, key, message):
    path = tmp_path / "suite.yaml"
    path.write_text(NIAH_SUITE.split("benchmarks:")[0] + f"benchmarks:\n  - {body}\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    text = str(err.value)
    assert message in text and f"suite.yaml:{line_of(path, key)}" in text


def test_shipped_retrieval_suites_load():
    root = Path(__file__).resolve().parents[1] / "suites"
    ruler = load_suite(root / "ruler.yaml")
    tasks = {c.bench_params["task"] for c in ruler.cases}
    assert tasks == {name for name in TASKS if not TASKS[name].needs_qa}
    assert {c.bench_params["length"] for c in ruler.cases} == {1024, 2048, 4096}
    # the paired test's shipped sample count (tests/test_paired.py) at every length
    assert {c.bench_params["samples"] for c in ruler.cases} == {40}
    niah = load_suite(root / "niah.yaml").cases
    assert niah and all(c.bench_params["samples"] >= 5 for c in niah)


@pytest.mark.slow
@pytest.mark.model
def test_the_bundled_model_finds_the_same_needle_the_same_way_on_mlx(bundled):
    """The real model on both backends: the same prompts, and identity's answers word for word."""
    pytest.importorskip("mlx.core")
    outs = []
    for backend in ("torch", "mlx"):
        kept = []
        ctx = cpu_context(bundled.spec, backend=backend,
                          loaded=bundled if backend == "torch" else None)
        ctx.keep = kept.append
        out = measurement(Niah).run(NiahParams(lengths=[1024], depths=[0, 50, 100]),
                                    implementation(build_method("identity"), backend), ctx)
        outs.append((out, [r["prediction"] for r in kept]))
    (t_out, t_answers), (m_out, m_answers) = outs
    assert t_out.comparable["prompts_sha256"] == m_out.comparable["prompts_sha256"]
    assert t_answers == m_answers


@pytest.mark.parametrize("free", [8 << 30, 80 << 30])  # this machine, an 80 GB GPU
def test_samples_are_grouped_within_the_row_and_the_device_memory_budgets(free):
    from kvbench.benchmarks.measure import retrieval
    from kvbench.models.budgets import DECODE_SHARE

    # 1 layer, 1 head of 512 at 2 bytes: 2 KiB of K+V a token
    session = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=512, value_dim=512,
                              kv_element_size=2, memo_key=("torch", "m", "cuda", "bfloat16"),
                              free_memory=lambda: free)
    reader = retrieval.Reader(ctx=SimpleNamespace(memo=Memo()), session=session, chat=None,
                              essay="")
    per_token = 2 << 10
    long = free // DECODE_SHARE // per_token // 3  # three rows this long fit, not four
    groups = reader.decode_groups([10, long, 10, 10, 10] + [10] * 40)
    assert groups[0] == [0, 1, 2]  # a fourth row would be held as long as the longest
    assert [len(g) for g in groups[1:]] == [16, 16, 10]
    assert sum(groups, []) == list(range(45))
    assert reader.decode_groups([]) == []
